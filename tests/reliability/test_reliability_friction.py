"""What a new user tripped over, against one real server: several served names, CORS,
X-Request-Id, plain error messages, vLLM's response and /v1/models fields, the
metrics vLLM's dashboards chart, and a quiet log (requests logged only when asked)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from server_utils import RemoteServer

ORIGIN = "http://ok.example"
SERVER_ARGS = ("--served-model-name", "first-name", "second-name",
               "--allowed-origins", json.dumps([ORIGIN]))  # fmt: skip
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def _post(server: RemoteServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kwargs)


def _events(resp: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]


def test_start_up_says_what_it_does_and_requests_are_not_logged(server: RemoteServer) -> None:
    assert _post(server, CMPL, {"prompt": "secret prompt text", "max_tokens": 2}).status_code == 200
    log = server.output()
    phases = ("start-up 1/4: loading the weights", "start-up 3/4: KV cache", "ready in")
    at = [log.find(phase) for phase in phases]
    assert -1 not in at and at == sorted(at), log
    assert "secret prompt text" not in log and "Received request" not in log


def test_several_served_names(server: RemoteServer) -> None:
    cards = httpx.get(server.url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["first-name", "second-name"]
    for card in cards:
        assert card["root"] == "first-name" and "/" not in card["root"]  # never a file path
        assert card["max_model_len"] == server.max_model_len
        assert card["permission"][0]["object"] == "model_permission"
    for name in ("first-name", "second-name"):
        resp = _post(server, CMPL, {"model": name, "prompt": "x", "max_tokens": 1})
        assert resp.status_code == 200 and resp.json()["model"] == name
    assert _post(server, CMPL, {"prompt": "x", "max_tokens": 1}).json()["model"] == "first-name"
    assert _post(server, CMPL, {"model": "other", "prompt": "x"}).status_code == 404


def test_request_id_header_is_echoed_or_made(server: RemoteServer) -> None:
    resp = _post(server, CMPL, {"prompt": "x", "max_tokens": 1}, headers={"X-Request-Id": "r-42"})
    assert resp.headers["x-request-id"] == "r-42"
    made = httpx.get(server.url + "/health").headers["x-request-id"]
    assert len(made) >= 16
    # Error answers carry one too.
    assert "x-request-id" in _post(server, CMPL, {"prompt": 5}).headers


def test_cors_allows_only_the_configured_origin(server: RemoteServer) -> None:
    def preflight(origin: str) -> httpx.Response:
        headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        return httpx.options(server.url + CMPL, headers=headers)

    ok = preflight(ORIGIN)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert preflight("http://evil.example").status_code == 400
    resp = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert resp.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        (CMPL, {"prompt": {"a": 1}}, "prompt"),
        (CMPL, {"prompt": "x", "stop": 5}, "stop"),
        (CHAT, {"messages": [{"role": "user", "content": [1]}]}, "messages.0.content"),
        ("/tokenize", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ],
)
def test_validation_errors_name_the_field_plainly(
    server: RemoteServer, path: str, body: Any, field: str
) -> None:
    error = _post(server, path, body).json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: "), error
    for internal in ("function-after", "list[", "[str", "Request]", "_warn_extra"):
        assert internal not in error["message"], error


def test_non_json_content_type_is_named(server: RemoteServer) -> None:
    for path in (CMPL, "/tokenize"):
        resp = httpx.post(
            server.url + path, content="hello", headers={"Content-Type": "text/plain"}
        )
        error = resp.json()["error"]
        assert resp.status_code == 400 and "application/json" in error["message"], error
        assert "text/plain" in error["message"]
    resp = httpx.post(server.url + "/tokenize", content="[1]",
                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert resp.json()["error"]["message"] == "the request body must be a JSON object"


def test_system_fingerprint_and_null_usage_in_streams(server: RemoteServer) -> None:
    for path, body in ((CMPL, {"prompt": "x"}), (CHAT, {"messages": MSGS})):
        full = _post(server, path, {**body, "max_tokens": 3}).json()
        assert full["system_fingerprint"].startswith("minivllm-")
        stream_body = {**body, "max_tokens": 3, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", server.url + path, json=stream_body, timeout=60) as resp:
            events = _events(resp)
        *chunks, last = events
        assert chunks and all("usage" in c and c["usage"] is None for c in chunks), chunks
        assert all(c["system_fingerprint"] == full["system_fingerprint"] for c in events)
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    # Without include_usage no chunk carries the field at all (OpenAI's shape).
    with httpx.stream("POST", server.url + CMPL, timeout=60,
                      json={"prompt": "x", "max_tokens": 2, "stream": True}) as resp:  # fmt: skip
        assert all("usage" not in c for c in _events(resp))


VLLM_METRICS = (
    "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
    "vllm:request_decode_time_seconds_count", "vllm:request_inference_time_seconds_count",
    "vllm:iteration_tokens_total_count", "vllm:request_params_n_count",
    "vllm:request_params_max_tokens_count",
)  # fmt: skip


def test_vllm_dashboard_metrics_and_aborts_counted_per_request(server: RemoteServer) -> None:
    before = {name: server.metric(name) for name in VLLM_METRICS}
    aborts = server.metric("vllm:request_success_total", finished_reason="abort")
    assert _post(
        server, CMPL, {"prompt": "x", "max_tokens": 4, "n": 2, "temperature": 1}
    ).is_success
    for name in VLLM_METRICS:
        assert server.metric(name) > before[name], name
    assert server.metric("vllm:request_params_n_sum") >= 2
    text = httpx.get(server.url + "/metrics").text
    assert 'vllm:cache_config_info{block_size="16"' in text
    assert 'num_gpu_blocks="512"' in text
    # One request with n=3, hung up on mid-stream: one abort, not three.
    body = {"prompt": "x", "max_tokens": 200, "n": 3, "temperature": 1, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", server.url + CMPL, json=body, timeout=60) as resp:
        next(resp.iter_lines())
    done = threading.Event()
    for _ in range(100):
        if server.metric("vllm:num_requests_running") == 0:
            done.set()
            break
        done.wait(0.1)
    assert done.is_set()
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborts + 1
