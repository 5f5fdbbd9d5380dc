"""The start-up log names its phases in the order they run, and says when speculative
decoding is on (method and draft length)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from compile_helpers import make_llm

PHASES = ("start-up 1/4", "start-up 2/4", "start-up 3/4: KV cache", "start-up 4/4")


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("minivllm")]


def _first_index(messages: list[str], text: str) -> int:
    found = [i for i, m in enumerate(messages) if text in m]
    assert found, f"{text!r} is not in the start-up log:\n" + "\n".join(messages)
    return found[0]


def test_phases_in_order_and_speculative_decoding_named(
    one_layer_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """-O2 with the CPU decode graph runs all four phases: weights, compile, KV cache,
    then the graph that needs the bound KV cache."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    with caplog.at_level(logging.INFO, logger="minivllm"):
        make_llm(
            one_layer_llama,
            decode_graph=True,
            compilation_config={"mode": "VLLM_COMPILE", "backend": "eager"},
            speculative_config=spec,
        )
    messages = _messages(caplog)
    at = [_first_index(messages, phase) for phase in PHASES]
    assert at == sorted(at), "\n".join(messages)
    spec_line = messages[_first_index(messages, "speculative decoding:")]
    assert "method ngram" in spec_line and "num_speculative_tokens=3" in spec_line
    assert "n-grams of 4-4 tokens" in spec_line
    assert at[0] < messages.index(spec_line) < at[2]


def test_no_speculative_line_without_speculative_config(
    one_layer_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="minivllm"):
        make_llm(one_layer_llama, compilation_config={"mode": 0})
    messages = _messages(caplog)
    assert _first_index(messages, "start-up 1/4") < _first_index(messages, "start-up 3/4")
    assert not any("speculative decoding" in m for m in messages)
