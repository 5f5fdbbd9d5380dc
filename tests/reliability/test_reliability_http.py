"""What hostile or careless clients send, against a real server: each bad request gets
its own 4xx with OpenAI's error body, and nobody else's request notices.

One server for the module, with an API key and a small body limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_utils import API_KEY, MAX_MODEL_LEN, RemoteServer

MAX_BODY = 200_000
SERVER_ARGS = ("--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY))
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
KV_TOKENS = 511 * 16
"""Tokens the test server's KV cache holds (512 blocks of 16, one reserved)."""


def _post(server: RemoteServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json", **kwargs.pop("headers", {})}
    content = body if isinstance(body, (str, bytes, Iterator)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60, **kwargs)


def _error(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    if param is not None:
        assert error["param"] == param, error
    return error


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: {"):
            yield json.loads(line[len("data: ") :])


def _long_stream_body(**extra: Any) -> dict[str, Any]:
    return {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True,
            "temperature": 0, "stream": True, **extra}  # fmt: skip


def _finish(events: Iterator[dict[str, Any]]) -> tuple[int, str | None, set[str]]:
    """(chunks with text, finish_reason, response ids) of the rest of a completion stream."""
    num_text, reason, ids = 0, None, set()
    for event in events:
        assert "error" not in event, event
        ids.add(event["id"])
        for choice in event["choices"]:
            num_text += bool(choice["text"])
            reason = choice["finish_reason"] or reason
    return num_text, reason, ids


# -- 1. seeds -----------------------------------------------------------------------
BAD_SEEDS = [
    (CMPL, {"prompt": "x", "max_tokens": 4, "temperature": 1.0, "seed": 2**64}),
    (CMPL, {"prompt": "x", "max_tokens": 4, "temperature": 1.0, "seed": -(2**63) - 1}),
    (CMPL, {"prompt": "x", "max_tokens": 4, "temperature": 1.0, "n": 2, "seed": 2**64 - 1}),
    (CHAT, {"messages": MSGS, "max_tokens": 4, "temperature": 1.0, "seed": 2**64}),
    (CHAT, {"messages": MSGS, "max_tokens": 4, "temperature": 1.0, "n": 2, "seed": 2**64 - 1}),
]


def test_out_of_range_seed_is_a_400_and_other_streams_go_on(server: RemoteServer) -> None:
    with httpx.stream(
        "POST", server.url + CMPL, json=_long_stream_body(), headers=AUTH, timeout=60
    ) as running:
        events = _events(running.iter_lines())
        next(events)
        for path, body in BAD_SEEDS:
            error = _error(_post(server, path, body), 400, "seed")
            assert str(2**64 - 1) in error["message"] or str(-(2**63)) in error["message"]
        num_text, reason, _ = _finish(events)
    assert reason == "length" and num_text >= 10
    # The largest seed itself is fine.
    body = {"prompt": "x", "max_tokens": 2, "temperature": 1.0, "seed": 2**64 - 1}
    assert _post(server, CMPL, body).status_code == 200


# -- 2. request chat templates ------------------------------------------------------
@pytest.mark.parametrize(
    "path,extra",
    [
        (CHAT, {"chat_template": "{{ messages[0]['content'] }}"}),
        ("/tokenize", {"chat_template": "{{ messages[0]['content'] }}"}),
        ("/tokenize", {"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
    ],
)
def test_request_chat_template_needs_the_trust_flag(
    server: RemoteServer, path: str, extra: dict[str, Any]
) -> None:
    error = _error(_post(server, path, {"messages": MSGS, "max_tokens": 2, **extra}), 400)
    assert "--trust-request-chat-template" in error["message"]
    assert error["param"] == "chat_template"
    # Template variables are fine; the server's own template still renders.
    kwargs = {"chat_template_kwargs": {"custom_flag": True}}
    assert _post(server, "/tokenize", {"messages": MSGS, **kwargs}).status_code == 200


# -- 3. body size ---------------------------------------------------------------------
def test_body_over_the_limit_is_a_413_whether_declared_or_streamed(server: RemoteServer) -> None:
    big = json.dumps({"prompt": "a " * MAX_BODY}).encode()
    error = _error(_post(server, CMPL, big), 413)
    assert str(MAX_BODY) in error["message"] and error["type"] == "RequestTooLargeError"

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for start in range(0, len(big), 16_384):
            yield big[start : start + 16_384]

    _error(_post(server, "/tokenize", chunks()), 413)
    assert _post(server, "/tokenize", {"prompt": "a " * 1000}).status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200


# -- 4. client request ids ------------------------------------------------------------
def test_reused_request_id_never_touches_the_original(server: RemoteServer) -> None:
    body = _long_stream_body(request_id="dup")
    with httpx.stream("POST", server.url + CMPL, json=body, headers=AUTH, timeout=60) as original:
        events = _events(original.iter_lines())
        assert next(events)["id"] == "dup"
        for _ in range(3):
            # Same id; the client hangs up as soon as the answer starts.
            with httpx.stream(
                "POST", server.url + CMPL, json=body, headers=AUTH, timeout=60
            ) as dup:
                assert dup.status_code == 200
        num_text, reason, ids = _finish(events)
    assert reason == "length" and num_text >= 10 and ids == {"dup"}
    resp = _post(server, CHAT, {"messages": MSGS, "max_tokens": 2, "request_id": "mine"})
    assert resp.json()["id"] == "mine"


# -- 5. streamed completion logprobs --------------------------------------------------
def test_streamed_completion_logprobs_are_complete(server: RemoteServer) -> None:
    body = {"prompt": "The sky is", "max_tokens": 5, "temperature": 0, "logprobs": 2,
            "stream": True, "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", server.url + CMPL, json=body, headers=AUTH, timeout=60) as resp:
        choices = [c for e in _events(resp.iter_lines()) for c in e["choices"]]
    offset = 0
    for choice in choices:
        lp = choice["logprobs"]
        assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
        assert "".join(lp["tokens"]) == choice["text"]
        assert lp["text_offset"][:1] in ([], [offset])
        offset += len(choice["text"])
        for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
            assert token in top and len(top) >= 2
    assert sum(len(c["logprobs"]["tokens"]) for c in choices) == 5


# -- 6. lone surrogates -----------------------------------------------------------------
SURROGATE = '"abc \\ud800 def"'
"""A JSON string holding a lone surrogate (a valid JSON escape, but not Unicode text)."""


@pytest.mark.parametrize(
    "path,body,param",
    [
        (CMPL, f'{{"prompt": {SURROGATE}, "max_tokens": 2}}', "prompt"),
        (CMPL, f'{{"prompt": ["ok", {SURROGATE}], "max_tokens": 2}}', "prompt"),
        (CMPL, f'{{"prompt": "x", "stop": [{SURROGATE}]}}', "stop"),
        (CMPL, f'{{"model": {SURROGATE}, "prompt": "x"}}', "model"),
        (CHAT, f'{{"messages": [{{"role": "user", "content": {SURROGATE}}}]}}', "messages"),
        ("/tokenize", f'{{"prompt": {SURROGATE}}}', "prompt"),
        ("/tokenize", f'{{"messages": [{{"role": "user", "content": {SURROGATE}}}]}}',
         "messages"),
    ],
)  # fmt: skip
def test_lone_surrogate_is_a_400_everywhere(
    server: RemoteServer, path: str, body: str, param: str
) -> None:
    error = _error(_post(server, path, body), 400, param)
    assert "surrogate" in error["message"]


# -- 8. n -------------------------------------------------------------------------------
def test_n_is_capped_and_must_fit_the_kv_cache(server: RemoteServer) -> None:
    for n in (129, 20_000):
        _error(_post(server, CMPL, {"prompt": "x", "n": n, "temperature": 1}), 400, "n")
    prompt = [100] * 600
    error = _error(_post(server, CMPL, {"prompt": prompt, "n": 16, "max_tokens": 1}), 400, "n")
    assert f"{16 * 600} tokens" in error["message"] and f"{KV_TOKENS} tokens" in error["message"]
    body = {"prompt": [100] * 8, "n": 3, "max_tokens": 2, "temperature": 1.0}
    assert len(_post(server, CMPL, body).json()["choices"]) == 3


# -- 9. the documented answers ----------------------------------------------------------
def test_openapi_documents_the_answers_the_server_gives(server: RemoteServer) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert '"422"' not in json.dumps(doc["paths"])
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path in (CMPL, CHAT):
        responses = doc["paths"][path]["post"]["responses"]
        for code in ("400", "401", "404", "413"):
            assert responses[code]["content"]["application/json"]["schema"] == error_ref
        assert "text/event-stream" in responses["200"]["content"]
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert (props["n"]["minimum"], props["n"]["maximum"]) == (1, 128)
    seed = props["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**64 - 1)
    assert props["top_p"]["anyOf"][0]["maximum"] == 1
    health = doc["paths"]["/health"]["get"]["responses"]["200"]
    assert "content" not in health
    resp = httpx.get(f"{server.url}/health")
    assert resp.status_code == 200 and resp.content == b""
    assert "json" not in resp.headers.get("content-type", "")


def test_405_names_the_allowed_methods(server: RemoteServer) -> None:
    resp = httpx.post(f"{server.url}/health")
    _error(resp, 405)
    assert resp.headers["allow"] == "GET"
    resp = httpx.get(server.url + CMPL, headers=AUTH)
    _error(resp, 405)
    assert resp.headers["allow"] == "POST"


def test_streaming_request_the_engine_refuses_is_a_4xx(server: RemoteServer) -> None:
    # Priority needs the priority policy (this server is fcfs): refused before the stream.
    for path, body in ((CMPL, {"prompt": "x"}), (CHAT, {"messages": MSGS})):
        resp = _post(server, path, {**body, "max_tokens": 2, "stream": True, "priority": 3})
        assert "priority" in _error(resp, 400, "priority")["message"]
    body = {"prompt": [100] * 10, "max_tokens": MAX_MODEL_LEN, "stream": True}
    _error(_post(server, CMPL, body), 400, "max_tokens")


# -- 10. the API key ----------------------------------------------------------------------
def test_api_key_guards_all_but_health_version_metrics_and_docs(server: RemoteServer) -> None:
    guarded = [("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]}),
               ("GET", "/v1/models", None), ("POST", CMPL, {"prompt": "hi"})]  # fmt: skip
    for method, path, body in guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            resp = httpx.request(method, server.url + path, json=body, headers=headers)
            assert _error(resp, 401)["type"] == "AuthenticationError"
            assert resp.headers["www-authenticate"] == "Bearer"
        resp = httpx.request(method, server.url + path, json=body, headers=AUTH, timeout=60)
        assert resp.status_code == 200, (path, resp.text)
    for path in ("/health", "/version", "/metrics", "/openapi.json"):
        assert httpx.get(server.url + path).status_code == 200, path
