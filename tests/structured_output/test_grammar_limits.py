"""The structured-output limits without a model: spec size and depth (iterative), what
no backend can enforce, the byte-bounded compile cache, the validation probe and the
engine-side mask deadline and time budget (fake backends stand in for slow grammars;
one real xgrammar check for the reported regexes)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from minivllm.config.structured_outputs import StructuredOutputsConfig
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
from minivllm.structured_output.bitmask import GrammarBitmask
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.spec import CompiledGrammar, GrammarSpec

VOCAB = 100
CONFIG = StructuredOutputsConfig(backend="xgrammar")


def _nest(levels: int, wrap: Any) -> Any:
    node: Any = {"type": "string"}
    for _ in range(levels):
        node = wrap(node)
    return node


def _spec(config: StructuredOutputsConfig = CONFIG, **kwargs: Any) -> GrammarSpec:
    return GrammarSpec.from_params(StructuredOutputsParams(**kwargs), config)


@pytest.mark.parametrize(
    "schema",
    [
        _nest(20_000, lambda x: {"type": "object", "properties": {"a": x}}),
        _nest(20_000, lambda x: {"type": "array", "items": x}),
        {"const": _nest(20_000, lambda x: [x])},
    ],
    ids=["properties", "items", "const"],
)
def test_deep_schemas_are_refused_without_recursion(schema: dict) -> None:
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
    clone = params.clone()  # deep-copying the schema would recurse 20k levels
    assert clone.structured_outputs is params.structured_outputs
    with pytest.raises(ValueError, match="max_spec_depth=64"):
        GrammarSpec.from_params(clone.structured_outputs, CONFIG)
    # As JSON text too (json.loads itself recurses per level).
    text = '{"const": ' + "[" * 20_000 + "]" * 20_000 + "}"
    with pytest.raises(ValueError, match="max_spec_depth"):
        _spec(json=text)


def test_depth_limit_is_exact() -> None:
    config = StructuredOutputsConfig(backend="xgrammar", max_spec_depth=3)
    _spec(config, json={"const": [[1]]})  # object, list, list: 3 levels
    with pytest.raises(ValueError, match="max_spec_depth=3"):
        _spec(config, json={"const": [[[1]]]})


def test_size_limit_applies_to_every_kind() -> None:
    config = StructuredOutputsConfig(backend="xgrammar", max_spec_bytes=1000)
    _spec(config, regex="a" * 1000)
    for kwargs in (
        {"regex": "a" * 1001},
        {"grammar": 'root ::= "' + "a" * 1000 + '"'},
        {"choice": [f"c{i}" for i in range(300)]},
        {"json": {"enum": [f"v{i}" for i in range(300)]}},
        {"json": '{"enum": [' + ", ".join(f'"v{i}"' for i in range(300)) + "]}"},
        {"regex": "é" * 600},  # counted in UTF-8 bytes, not characters
    ):
        with pytest.raises(ValueError, match="max_spec_bytes=1000"):
            _spec(config, **kwargs)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "http://example.com/s.json"}, "external document"),
        ({"properties": {"a": {"$ref": "file:///etc/passwd"}}}, "external document"),
        ({"anyOf": [{"$ref": "other.json#/x"}]}, "external document"),
        ({"not": {}}, '"not"'),
        ({"properties": {"a": {"items": {"not": {"type": "string"}}}}}, '"not"'),
    ],
)
def test_unenforceable_schemas_are_refused(schema: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        _spec(json=schema)


def test_keywords_named_not_are_fine_as_property_names_and_values() -> None:
    _spec(json={"properties": {"not": {"type": "string"}}, "default": {"not": 1}})
    _spec(json={"$ref": "#/$defs/a", "$defs": {"a": {"type": "integer"}}})


class _Matcher:
    """A fake matcher: each mask takes ``delay`` seconds and allows ``allowed``."""

    def __init__(self, delay: float = 0.0, allowed: bool = True) -> None:
        self.delay, self.allowed, self.accepted = delay, allowed, 0

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        time.sleep(self.delay)  # sleeping releases the GIL, as the libraries do
        bitmask[row] = -1 if self.allowed else 0

    def accept_token(self, token_id: int) -> bool:
        self.accepted += 1
        return True

    def is_terminated(self) -> bool:
        return False


class _Backend:
    name = "xgrammar"

    def __init__(self, delay: float = 0.0, allowed: bool = True, size: int = 1000) -> None:
        self.delay, self.allowed, self.size, self.compiles = delay, allowed, size, 0

    def compile(self, spec: GrammarSpec) -> str:
        self.compiles += 1
        return spec.text

    def size_bytes(self, compiled: str) -> int:
        return self.size

    def new_matcher(self, compiled: str) -> _Matcher:
        return _Matcher(self.delay, self.allowed)


def _manager(backend: _Backend, **config: Any) -> StructuredOutputManager:
    manager = StructuredOutputManager(
        StructuredOutputsConfig(backend="xgrammar", **config), object(), VOCAB, [0]
    )
    manager._backends["xgrammar"] = backend
    return manager


def test_cache_is_bounded_in_bytes() -> None:
    backend = _Backend(size=1000)
    manager = _manager(backend, cache_max_bytes=3500, max_grammar_bytes=1000)
    for i in range(10):
        manager.grammar_for(StructuredOutputsParams(regex=f"r{i}"))
        assert manager.cache_bytes <= 3500
    assert manager.cache_bytes == 3000 and backend.compiles == 10
    manager.grammar_for(StructuredOutputsParams(regex="r9"))  # kept: the most recent
    manager.grammar_for(StructuredOutputsParams(regex="r0"))  # dropped long ago
    assert backend.compiles == 11
    big = _manager(_Backend(size=1001), cache_max_bytes=3500, max_grammar_bytes=1000)
    with pytest.raises(ValueError, match="max_grammar_bytes=1000"):
        big.grammar_for(StructuredOutputsParams(regex="r"))
    with pytest.raises(ValueError, match="must not exceed cache_max_bytes"):
        StructuredOutputsConfig(max_grammar_bytes=2000, cache_max_bytes=1000)


def test_probe_refuses_slow_and_empty_grammars_once() -> None:
    slow = _Backend(delay=0.5)
    manager = _manager(slow, max_mask_ms=50)
    start = time.monotonic()
    with pytest.raises(ValueError, match="max_mask_ms=50"):
        manager.grammar_for(StructuredOutputsParams(regex="slow"))
    assert time.monotonic() - start < 0.4  # the deadline, not the 0.5 s mask
    with pytest.raises(ValueError, match="max_mask_ms=50"):  # remembered, not recompiled
        manager.grammar_for(StructuredOutputsParams(regex="slow"))
    assert slow.compiles == 1
    with pytest.raises(ValueError, match="cannot be satisfied"):
        _manager(_Backend(allowed=False)).grammar_for(StructuredOutputsParams(regex="x"))
    fine = _Backend()
    _manager(fine, probe_steps=3).grammar_for(StructuredOutputsParams(regex="x"))


def test_probe_refuses_a_mask_still_over_half_the_limit_at_its_last_step() -> None:
    # Each mask under the limit, but the last still over half of it: a cost that grows
    # with the output would pass the limit inside the engine a few tokens later.
    with pytest.raises(ValueError, match=r"over half of max_mask_ms=100"):
        _manager(_Backend(delay=0.07), max_mask_ms=100, probe_steps=2).grammar_for(
            StructuredOutputsParams(regex="near")
        )
    _manager(_Backend(delay=0.02), max_mask_ms=100, probe_steps=2).grammar_for(
        StructuredOutputsParams(regex="far")
    )


def _grammar(backend: _Backend) -> CompiledGrammar:
    return CompiledGrammar(_spec(regex="x"), backend, "x")  # type: ignore[arg-type]


def test_engine_mask_deadline_fails_only_the_slow_row() -> None:
    config = StructuredOutputsConfig(max_mask_ms=100)
    bitmask = GrammarBitmask(VOCAB, torch.device("cpu"), config)
    slow, fast = _grammar(_Backend(delay=2.0)).new_matcher(), _grammar(_Backend()).new_matcher()
    failed: dict[str, str] = {}
    start = time.monotonic()
    filled = bitmask.fill([slow, None, fast], ["slow", "plain", "fast"], failed)
    assert time.monotonic() - start < 1.0  # not the slow row's 2 s
    assert list(failed) == ["slow"] and "max_mask_ms=100" in failed["slow"]
    assert filled is not None and filled[0] is not None and filled[0].tolist() == [0, 2]
    assert bool((filled[1] == -1).all())  # the failed row is left unmasked, not empty
    bitmask.accept(["slow", "plain", "fast"], [slow, None, fast], [1, 2, 3], failed)
    assert slow.inner.accepted == 0 and fast.inner.accepted == 1
    # Later steps do not wait for the abandoned call, and never fill its matcher again.
    start = time.monotonic()
    assert bitmask.fill([fast], ["fast"], failed) is not None
    assert time.monotonic() - start < 0.5


def test_engine_fails_an_empty_mask_and_a_spent_budget() -> None:
    config = StructuredOutputsConfig(max_mask_ms=200, max_request_grammar_s=0.1)
    bitmask = GrammarBitmask(VOCAB, torch.device("cpu"), config)
    empty = _grammar(_Backend(allowed=False)).new_matcher()
    failed: dict[str, str] = {}
    bitmask.fill([empty], ["empty"], failed)
    assert "allows no next token" in failed["empty"]
    busy = _grammar(_Backend(delay=0.04)).new_matcher()
    steps = 0
    while "busy" not in failed and steps < 10:
        bitmask.fill([busy], ["busy"], failed)
        steps += 1
    assert 2 <= steps <= 4 and "max_request_grammar_s=0.1" in failed["busy"]
    with pytest.raises(ValueError, match="allows no next token"):  # offline: no failed dict
        bitmask.fill([_grammar(_Backend(allowed=False)).new_matcher()])


@pytest.fixture(scope="module")
def xgrammar_manager() -> StructuredOutputManager:
    from minivllm.tokenizer import get_tokenizer
    from minivllm.transformers_utils.config import default_model_path

    tokenizer = get_tokenizer(default_model_path())
    return StructuredOutputManager(CONFIG, tokenizer, 49152, [tokenizer.eos_token_id])


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (StructuredOutputsParams(regex="(.{0,20}){0,20}"), "too slow"),
        (StructuredOutputsParams(regex="[^\\x00-\\U0010FFFF]"), "cannot be satisfied"),
        (StructuredOutputsParams(json={"type": "array", "uniqueItems": True}), "uniqueItems"),
    ],
    ids=["slow", "unsatisfiable", "ignored-keyword"],
)
def test_xgrammar_refuses_the_reported_grammars(
    xgrammar_manager: StructuredOutputManager, params: StructuredOutputsParams, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        xgrammar_manager.grammar_for(params)
    xgrammar_manager.grammar_for(StructuredOutputsParams(regex=r"\d{3}-\d{4}"))
