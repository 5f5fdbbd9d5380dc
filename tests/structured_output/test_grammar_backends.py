"""The grammar backends (xgrammar, llguidance) and the sampler's bitmask, without a model.

Random logits stand in for the model: masked by the grammar and sampled greedily, they
must still spell a valid output, token by token through the real tokenizer.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from minivllm.config.structured_outputs import StructuredOutputsConfig
from minivllm.sample.sampler import apply_grammar_bitmask
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
from minivllm.structured_output.bitmask import GrammarBitmask, accept_tokens
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.tokenizer import get_tokenizer
from minivllm.transformers_utils.config import default_model_path

VOCAB = 49152  # the default model's vocabulary
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99},
        "kind": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
    },
    "required": ["id", "kind", "tags"],
    # llguidance follows JSON schema here: without this, extra keys may follow.
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201
    return get_tokenizer(default_model_path())


@pytest.fixture(scope="module", params=["xgrammar", "guidance"])
def manager(request: pytest.FixtureRequest, tokenizer) -> StructuredOutputManager:  # noqa: ANN001
    config = StructuredOutputsConfig(backend=request.param, disable_any_whitespace=True)
    return StructuredOutputManager(config, tokenizer, VOCAB, [tokenizer.eos_token_id])


def _generate(manager, tokenizer, params: StructuredOutputsParams, seed: int) -> str:  # noqa: ANN001
    """Random logits, masked by the grammar, argmax until the grammar ends."""
    matcher = manager.grammar_for(params).new_matcher()
    bitmask = GrammarBitmask(VOCAB, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    tokens: list[int] = []
    for _ in range(80):
        filled = bitmask.fill([matcher])
        if filled is None:
            break
        logits = torch.randn(1, VOCAB, generator=gen)
        apply_grammar_bitmask(logits, *filled)
        token = int(logits.argmax())
        accept_tokens(["r"], [matcher], [token])
        tokens.append(token)
    assert matcher.is_terminated(), tokenizer.decode(tokens)
    assert tokens[-1] == tokenizer.eos_token_id
    return tokenizer.decode(tokens[:-1])


def test_random_logits_spell_valid_outputs(manager, tokenizer) -> None:  # noqa: ANN001
    for seed in range(2):
        text = _generate(manager, tokenizer, StructuredOutputsParams(json=SCHEMA), seed)
        jsonschema.validate(json.loads(text), SCHEMA)
        text = _generate(
            manager, tokenizer, StructuredOutputsParams(regex=r"[a-c]{2}\d{1,3}"), seed
        )
        assert re.fullmatch(r"[a-c]{2}\d{1,3}", text)
        text = _generate(manager, tokenizer, StructuredOutputsParams(choice=["no", "yes"]), seed)
        assert text in ("no", "yes")


def test_bad_inputs_name_the_problem(manager) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="invalid regex"):
        manager.grammar_for(StructuredOutputsParams(regex="(ab"))
    with pytest.raises(ValueError, match="invalid JSON schema"):
        manager.grammar_for(StructuredOutputsParams(json={"type": "nonsense"}))


def test_free_whitespace_is_an_option(tokenizer) -> None:  # noqa: ANN001
    loose = StructuredOutputManager(StructuredOutputsConfig(), tokenizer, VOCAB, [2])
    tight = StructuredOutputManager(
        StructuredOutputsConfig(disable_any_whitespace=True), tokenizer, VOCAB, [2]
    )
    spaced = tokenizer.encode('{ "a" : 1 }')
    params = StructuredOutputsParams(json={"type": "object"})
    for manager, accepted in ((loose, True), (tight, False)):
        matcher = manager.grammar_for(params).new_matcher()
        assert all(matcher.accept_token(t) for t in spaced) is accepted


def test_auto_falls_back_to_llguidance_only_for_unsupported_features(tokenizer) -> None:  # noqa: ANN001
    manager = StructuredOutputManager(StructuredOutputsConfig(), tokenizer, VOCAB, [2])
    grammar = manager.grammar_for(StructuredOutputsParams(regex="[0-9]+"))
    assert grammar.backend.name == "xgrammar"
    # A syntax error fails at once (no second library to try).
    with pytest.raises(ValueError, match="invalid regex"):
        manager.grammar_for(StructuredOutputsParams(regex="[0-"))
    assert "guidance" not in manager._backends
    no_fallback = StructuredOutputsParams(json={"type": "nonsense"}, disable_fallback=True)
    with pytest.raises(ValueError, match="Unsupported"):
        manager.grammar_for(no_fallback)
    assert "guidance" not in manager._backends


def test_bitmask_masks_only_the_constrained_rows() -> None:
    logits = torch.randn(3, 70)
    original = logits.clone()
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    bitmask[0, 0] = (1 << 5) | -(1 << 31)  # tokens 5 and 31 (the int32 sign bit)
    bitmask[0, 2] = 1 << 1  # token 65
    apply_grammar_bitmask(logits, torch.tensor([1]), bitmask)
    assert torch.equal(logits[[0, 2]], original[[0, 2]])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed == [5, 31, 65]
    assert torch.equal(logits[1, allowed], original[1, allowed])
    # All rows at once (rows None), and a logits row wider than the bitmask.
    wide = torch.randn(1, 100)
    apply_grammar_bitmask(wide, None, bitmask[:1])
    assert torch.isfinite(wide[0]).nonzero().flatten().tolist() == [5, 31, 65]


def test_params_and_config_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="disable_any_whitespace"):
        StructuredOutputsParams(regex="a", whitespace_pattern=" ")
    # A dict (from JSON) becomes the params class; clones keep it.
    params = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert params.clone().structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    with pytest.raises(ValueError, match="outlines"):
        StructuredOutputsConfig(backend="outlines")
    with pytest.raises(ValueError, match="deepseek_r1, generic, qwen3"):
        StructuredOutputsConfig(reasoning_parser="nope")
    with pytest.raises(ValueError, match="plugins"):
        StructuredOutputsConfig(reasoning_parser_plugin="x.py")


def test_worker_replays_the_output_after_a_preemption(tokenizer) -> None:  # noqa: ANN001
    from minivllm.scheduler.output import NewRequestData
    from minivllm.worker.input_batch import CachedRequestState

    manager = StructuredOutputManager(StructuredOutputsConfig(), tokenizer, VOCAB, [2])
    grammar = manager.grammar_for(StructuredOutputsParams(regex="[a-z]+-[0-9]+"))
    done = tokenizer.encode("abc-", add_special_tokens=False)
    params = SamplingParams()

    def rebuilt(output_token_ids: list[int]) -> CachedRequestState:
        data = NewRequestData("r", [1, 2, 3], params, [1], 3, output_token_ids, grammar)
        return CachedRequestState.from_new(data, torch.device("cpu"))

    matcher = rebuilt(done).grammar_matcher
    assert matcher is not None
    # Past "abc-" only digits may follow: the replayed matcher knows where it is.
    bitmask = GrammarBitmask(VOCAB, torch.device("cpu"))
    _, mask = bitmask.fill([matcher])
    logits = torch.zeros(1, VOCAB)
    apply_grammar_bitmask(logits, None, mask)
    allowed = [tokenizer.decode([t]) for t in torch.isfinite(logits[0]).nonzero().flatten()]
    assert allowed and all(text.isdigit() for text in allowed)
    with pytest.raises(ValueError, match="breaks the request's grammar"):
        rebuilt(tokenizer.encode("ABC", add_special_tokens=False))
