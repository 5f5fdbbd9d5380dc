"""`ReasoningConfig`: the flags, the markers, the link with the structured outputs
config, the token ids found with the tokenizer, and the one-line CLI errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm.args.engine_args import EngineArgs
from minivllm.config.reasoning import ReasoningConfig
from minivllm.engine.reasoning import check_thinking_budget
from minivllm.entrypoints.cli.main import main
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import get_tokenizer
from minivllm.transformers_utils.config import default_model_path


def engine_config(**kwargs: object):  # noqa: ANN201
    return EngineArgs(**kwargs).create_engine_config()  # type: ignore[arg-type]


def test_flags_build_the_config_and_name_the_parser_for_structured_outputs() -> None:
    assert engine_config().reasoning_config is None  # nothing asked: no reasoning
    cfg = engine_config(reasoning_parser="qwen3")
    reasoning = cfg.reasoning_config
    assert reasoning is not None and reasoning.parser_name == "qwen3"
    assert (reasoning.start_str, reasoning.end_str) == ("<think>", "</think>")
    assert cfg.structured_outputs_config.reasoning_parser == "qwen3"
    generic = engine_config(reasoning_start_str="<|a|>", reasoning_end_str="<|b|>")
    assert generic.reasoning_config.parser_name == "generic"  # type: ignore[union-attr]
    assert generic.reasoning_config.new_parser().extract_reasoning("x<|b|>y") == ("x", "y")  # type: ignore[union-attr]
    # vLLM's other spelling: a parser named in the structured outputs config.
    other = engine_config(structured_outputs_config={"reasoning_parser": "deepseek_r1"})
    assert other.reasoning_config.parser_name == "deepseek_r1"  # type: ignore[union-attr]


def test_bad_settings_name_the_fix() -> None:
    with pytest.raises(ValueError, match="--reasoning-parser.*deepseek_r1, generic, qwen3"):
        engine_config(reasoning_parser="nope")
    with pytest.raises(ValueError, match="reasoning_start_str and reasoning_end_str"):
        ReasoningConfig(reasoning_start_str="<t>")
    with pytest.raises(ValueError, match="must differ"):
        ReasoningConfig(reasoning_start_str="|", reasoning_end_str="|")
    assert not ReasoningConfig().requested and ReasoningConfig().markers() is None


def test_token_ids_come_from_the_tokenizer_even_for_multi_token_markers() -> None:
    tokenizer = get_tokenizer(default_model_path())
    reasoning = ReasoningConfig(reasoning_parser="deepseek_r1")
    assert not reasoning.enabled
    reasoning.initialize_token_ids(tokenizer)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    assert len(end) > 1  # SmolLM2 has no <think> token: the marker spans several
    assert reasoning.reasoning_end_token_ids == end
    markers = reasoning.markers()
    assert markers is not None and markers.end_token_ids == tuple(end)
    assert tokenizer.decode(list(markers.start_token_ids)) == "<think>"


def test_a_thinking_budget_needs_a_reasoning_model() -> None:
    plain = SimpleNamespace(reasoning_config=None)
    with pytest.raises(ValueError, match="--reasoning-parser"):
        check_thinking_budget(plain, SamplingParams(thinking_token_budget=3))  # type: ignore[arg-type]
    check_thinking_budget(plain, SamplingParams())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thinking_token_budget must be an int >= 0"):
        SamplingParams(thinking_token_budget=-1)


def test_unknown_parser_exits_2_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["serve", "--reasoning-parser", "nope", "--port", "18250"])
    except SystemExit as exc:
        status = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--reasoning-parser: unknown reasoning_parser 'nope'; choose one of deepseek_r1, " in err
    assert err.endswith("generic, qwen3")
