"""`minivllm serve --speculative-config ...`: the server speculates, streams the
verified tokens, reports each request's acceptance in its choice, and vLLM's
speculative decoding counters on /metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from server_utils import MODEL_NAME, RemoteServer

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}  # fmt: skip
PROMPT = "one two three four, one two three four, one two three four, one two"


@pytest.fixture(scope="module")
def spec_server() -> Iterator[RemoteServer]:
    remote = RemoteServer(
        "--speculative-config",
        json.dumps(SPEC),
        "--observability-config.per_request_spec_decode_metrics",
        "summary",
        max_model_len=512,
        num_gpu_blocks=64,
    )
    try:
        remote.wait_ready()
        yield remote
    finally:
        remote.stop()


def test_server_speculates_and_counts_it(spec_server: RemoteServer) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    plain = httpx.post(f"{spec_server.url}/v1/completions", json=body, timeout=120).json()
    text = plain["choices"][0]["text"]
    assert plain["usage"]["completion_tokens"] == 24
    # Per-request acceptance (per_request_spec_decode_metrics=summary) in the choice.
    mine = plain["choices"][0]["spec_decode_metrics"]
    assert mine["num_drafts"] > 0 and 0 <= mine["acceptance_rate"] <= 1
    # Streaming carries the same text (several tokens may arrive per step).
    pieces = []
    with httpx.stream(
        "POST", f"{spec_server.url}/v1/completions", json={**body, "stream": True}, timeout=120
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(pieces) == text
    drafted = spec_server.metric("vllm:spec_decode_num_draft_tokens_total")
    accepted = spec_server.metric("vllm:spec_decode_num_accepted_tokens_total")
    assert spec_server.metric("vllm:spec_decode_num_drafts_total") > 0
    assert 0 < accepted <= drafted
    per_pos = [
        spec_server.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert sum(per_pos) == accepted
