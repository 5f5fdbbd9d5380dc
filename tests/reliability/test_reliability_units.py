"""Unit-level checks behind the reliability fixes: seed ranges, the streamed legacy
logprobs object."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm.entrypoints.openai.protocol import (
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from minivllm.entrypoints.openai.serving_completion import build_legacy_logprobs
from minivllm.entrypoints.openai.sse_stream import sse
from minivllm.outputs import Logprob
from minivllm.sampling_params import MAX_SEED, MIN_SEED, SamplingParams


def test_seed_range_is_what_torch_generators_take() -> None:
    generator = torch.Generator()
    for seed in (MIN_SEED, MAX_SEED):
        generator.manual_seed(seed)
    for seed in (MIN_SEED - 1, MAX_SEED + 1):
        with pytest.raises((RuntimeError, ValueError)):
            generator.manual_seed(seed)


@pytest.mark.parametrize(
    "seed,n",
    [(MAX_SEED + 1, 1), (2**70, 1), (MIN_SEED - 1, 1), (MAX_SEED, 2), (MAX_SEED - 2, 4)],
)
def test_out_of_range_seed_is_a_value_error(seed: int, n: int) -> None:
    with pytest.raises(ValueError, match=r"^seed"):
        SamplingParams(seed=seed, n=n, temperature=1.0)


@pytest.mark.parametrize("seed,n", [(MIN_SEED, 1), (MAX_SEED, 1), (MAX_SEED - 3, 4), (-1, 1)])
def test_seeds_in_range_are_accepted(seed: int, n: int) -> None:
    SamplingParams(seed=seed, n=n, temperature=1.0)


def test_streamed_legacy_logprobs_keep_every_field() -> None:
    position = {7: Logprob(-0.5, 1, "a"), 9: Logprob(-1.5, 2, "b")}
    logprobs = build_legacy_logprobs([7, 9], [position, position], 1, 3, str)
    choice = CompletionResponseStreamChoice(index=0, text="ab", logprobs=logprobs)
    chunk = CompletionStreamResponse(id="x", created=0, model="m", choices=[choice])
    sent = json.loads(sse(chunk)[len("data: ") :])["choices"][0]["logprobs"]
    assert sent == {
        "text_offset": [3, 4],
        "token_logprobs": [-0.5, -1.5],
        "tokens": ["a", "b"],
        "top_logprobs": [{"a": -0.5}, {"b": -1.5, "a": -0.5}],
    }


def test_requests_are_logged_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from minivllm.entrypoints.openai.serving_engine import OpenAIServing

    engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=64))
    params = SamplingParams(max_tokens=1)
    caplog.set_level("INFO", logger="minivllm")
    quiet = OpenAIServing(engine, None, None, pool=object())  # type: ignore[arg-type]
    quiet.log_request("r1", "a secret prompt", [1, 2, 3], params)
    assert "secret" not in caplog.text
    loud = OpenAIServing(engine, None, None, max_log_len=4, pool=object(),  # type: ignore[arg-type]
                         enable_log_requests=True)  # fmt: skip
    loud.log_request("r2", "a secret prompt", list(range(100)), params)
    assert "'a se'" in caplog.text and "[0, 1, 2, 3]" in caplog.text
    assert "secret" not in caplog.text and "99" not in caplog.text
