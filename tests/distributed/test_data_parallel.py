"""Data parallelism on the default model, one core per replica: ``-dp 2`` gives the
same greedy text as one engine, spreads requests over both replicas (per-engine
counters in /metrics), and a killed replica fails only its own request while
/health turns 503 and the other replica goes on serving.

The reference is an ordinary one-engine `LLM` (``-dp 1``) in this process.  The
same server checks run with replicas as Ray actors on a local Ray instance (slow)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_utils import MODEL_NAME, RemoteServer

from minivllm import LLM, SamplingParams

ENGINE = {"dtype": "float32", "optimization_level": 0, "max_model_len": 512}
PROMPTS = ["Hello, my name is", "The capital of France is", "1 2 3 4", "Once upon a time"]
MAX_TOKENS = 8
UNHEALTHY_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def reference() -> list[str]:
    llm = LLM(num_gpu_blocks_override=64, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.slow  # the server test below checks the same replicas, parity and spread
def test_llm_dp2_matches_one_engine_and_uses_both(reference: list[str]) -> None:
    llm = LLM(data_parallel_size=2, num_gpu_blocks_override=64, **ENGINE)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        assert [o.outputs[0].text for o in outputs] == reference
        assert llm.llm_engine.request_counts() == [2, 2]
        pids = {r.info.pid for r in llm.llm_engine.replicas}
        assert len(pids) == 2 and os.getpid() not in pids
    finally:
        llm.llm_engine.shutdown()


def _complete(url: str, prompt: str) -> str:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


def _stream(url: str, events: list[str], first: threading.Event) -> None:
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                first.set()
    first.set()


def _aborted(server: RemoteServer) -> list[float]:
    return [server.metric("vllm:request_success_total", engine=str(e),
                          finished_reason="abort") for e in (0, 1)]  # fmt: skip


def _check_disconnect_aborts_on_its_replica(server: RemoteServer) -> None:
    """A client that leaves mid-stream: its replica aborts the request (the abort
    crosses to the replica's process) and runs nothing afterwards."""
    before = _aborted(server)
    body = {"model": MODEL_NAME, "prompt": "Tell me a story", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first token
    deadline = time.monotonic() + 30
    while sum(_aborted(server)) == sum(before):
        assert time.monotonic() < deadline, "the abandoned request was never aborted"
        time.sleep(0.2)
    assert sum(_aborted(server)) == sum(before) + 1
    for engine in ("0", "1"):
        assert server.metric("vllm:num_requests_running", engine=engine) == 0


def _engine_pids(log: str) -> dict[int, int]:
    found = re.findall(r"data-parallel engine (\d+) ready \(pid (\d+)", log)
    return {int(engine): int(pid) for engine, pid in found}


@pytest.fixture(
    scope="module",
    params=[
        "mp",
        # Slow: a local Ray instance starts first; the "mp" run checks the same behaviour.
        pytest.param("ray", marks=pytest.mark.slow),
    ],
)
def dp2_server(request: pytest.FixtureRequest):  # noqa: ANN201
    server = RemoteServer(
        "-dp", "2", "--data-parallel-backend", request.param, "--dtype", "float32",
        max_model_len=512, num_gpu_blocks=64,
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        pids = list(_engine_pids(server.output()).values())
        server.stop()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_dp2_server_same_text_spread_and_a_dead_replica(
    dp2_server: RemoteServer, reference: list[str]
) -> None:
    url = dp2_server.url
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(lambda p: _complete(url, p), PROMPTS)) == reference
    done = [dp2_server.metric("vllm:request_success_total", engine=str(e),
                              finished_reason="length") for e in (0, 1)]  # fmt: skip
    assert sum(done) == len(PROMPTS) and min(done) >= 1, done

    _check_disconnect_aborts_on_its_replica(dp2_server)
    pids = _engine_pids(dp2_server.output())
    assert sorted(pids) == [0, 1]
    events: list[str] = []
    first = threading.Event()
    client = threading.Thread(target=_stream, args=(url, events, first))
    client.start()
    assert first.wait(60), "the long request never started streaming"
    running = [dp2_server.metric("vllm:num_requests_running", engine=str(e)) for e in (0, 1)]
    victim = running.index(1.0)
    os.kill(pids[victim], signal.SIGKILL)
    client.join(60)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]["message"]
    assert f"data-parallel engine {victim}" in error and "died" in error, error

    deadline = time.monotonic() + UNHEALTHY_WITHIN_S
    while httpx.get(f"{url}/health").status_code != 503:
        assert time.monotonic() < deadline, "/health still 200 after a replica died"
        time.sleep(0.2)
    # The survivor takes every new request, with the same answers.
    assert [_complete(url, p) for p in PROMPTS[:2]] == reference[:2]
    survivor = str(1 - victim)
    assert dp2_server.metric("vllm:request_success_total", engine=survivor,
                             finished_reason="length") == done[1 - victim] + 2  # fmt: skip
