"""Bad requests get OpenAI-style 4xx errors and never hurt the server; a client that
disconnects mid-stream has its request aborted and its KV blocks freed."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from input_helpers import make_input_processor
from server_utils import API_KEY, MAX_MODEL_LEN, MODEL_NAME

from minivllm.sampling_params import SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]

BAD_REQUESTS = [
    # (id, path, body (a str is sent raw), status, error type, param or None, message part)
    ("malformed-json", CMPL, '{"prompt": "x", max_tokens}', 400, "BadRequestError", None, "JSON"),
    ("not-json-object", CMPL, "[1, 2", 400, "BadRequestError", None, "JSON"),
    ("wrong-type-max-tokens", CMPL, {"prompt": "x", "max_tokens": "lots"}, 400,
     "BadRequestError", "max_tokens", "integer"),
    ("wrong-type-n", CHAT, {"messages": MSGS, "n": [2]}, 400, "BadRequestError", "n", "integer"),
    ("wrong-type-messages", CHAT, {"messages": "hi"}, 400, "BadRequestError", "messages", ""),
    ("missing-prompt", CMPL, {"max_tokens": 3}, 400, "BadRequestError", "prompt", "required"),
    ("negative-temperature", CMPL, {"prompt": "x", "temperature": -0.5}, 400,
     "BadRequestError", "temperature", "temperature"),
    ("top-p-zero", CMPL, {"prompt": "x", "top_p": 0}, 400, "BadRequestError", "top_p", "top_p"),
    ("top-p-above-one", CHAT, {"messages": MSGS, "top_p": 1.5}, 400, "BadRequestError",
     "top_p", "top_p"),
    ("n-zero", CMPL, {"prompt": "x", "n": 0}, 400, "BadRequestError", "n", "n: "),
    ("max-tokens-zero", CMPL, {"prompt": "x", "max_tokens": 0}, 400, "BadRequestError",
     "max_tokens", "max_tokens"),
    ("max-completion-tokens-zero", CHAT, {"messages": MSGS, "max_completion_tokens": 0}, 400,
     "BadRequestError", "max_completion_tokens", "max_completion_tokens"),
    ("beyond-max-model-len", CMPL, {"prompt": "Hello there", "max_tokens": MAX_MODEL_LEN}, 400,
     "BadRequestError", "max_tokens", f"{MAX_MODEL_LEN}"),
    ("prompt-too-long", CMPL, {"prompt": [1] * (MAX_MODEL_LEN + 5), "max_tokens": 1}, 400,
     "BadRequestError", "prompt", f"{MAX_MODEL_LEN + 5} tokens"),
    ("unknown-model", CMPL, {"model": "gpt-4", "prompt": "x"}, 404, "NotFoundError", "model",
     "gpt-4"),
    ("unknown-model-chat", CHAT, {"model": "nope", "messages": MSGS}, 404, "NotFoundError",
     "model", "nope"),
    ("empty-prompt", CMPL, {"prompt": ""}, 400, "BadRequestError", None, "empty"),
    ("token-out-of-vocab", CMPL, {"prompt": [10**9]}, 400, "BadRequestError", None, "vocab"),
]  # fmt: skip


@pytest.mark.parametrize(
    "path,body,status,err_type,param,fragment",
    [pytest.param(*case[1:], id=case[0]) for case in BAD_REQUESTS],
)
def test_bad_request_gets_openai_error(
    server, path, body, status, err_type, param, fragment
) -> None:  # noqa: ANN001
    headers = {**AUTH, "Content-Type": "application/json"}
    content = body if isinstance(body, str) else json.dumps(body)
    resp = httpx.post(server.url + path, content=content, headers=headers, timeout=60)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == err_type and error["code"] == status
    assert error["param"] == param
    assert fragment in error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_beyond_max_model_len_message_has_the_numbers(server) -> None:  # noqa: ANN001
    body = {"prompt": [1, 2, 3], "max_tokens": MAX_MODEL_LEN}
    error = httpx.post(server.url + CMPL, json=body, headers=AUTH).json()["error"]
    assert f"{MAX_MODEL_LEN} tokens" in error["message"]
    assert f"{MAX_MODEL_LEN + 3} (3 in the prompt + {MAX_MODEL_LEN} max_tokens)" in error["message"]


def test_prompt_length_rule_and_message_are_the_offline_engines(server) -> None:  # noqa: ANN001
    # A prompt of exactly max_model_len tokens leaves no room for an answer: the server
    # refuses it with the very message the engine's one validation point gives offline.
    ids = [1] * MAX_MODEL_LEN
    offline = make_input_processor(MAX_MODEL_LEN, 50_000, num_blocks=MAX_MODEL_LEN // 4 + 2)
    with pytest.raises(ValueError) as refused:
        offline.process(ids, SamplingParams(max_tokens=None))
    error = httpx.post(server.url + CMPL, json={"prompt": ids}, headers=AUTH).json()["error"]
    assert error["message"] == str(refused.value) and error["param"] == "prompt"


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}]
)
def test_missing_or_wrong_api_key_is_401(server, headers) -> None:  # noqa: ANN001
    for path in ("/v1/models", CMPL):
        resp = httpx.post(server.url + path, json={"prompt": "x"}, headers=headers) if path == CMPL \
            else httpx.get(server.url + path, headers=headers)  # fmt: skip
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "AuthenticationError"
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_openai_client_raises_typed_errors(server) -> None:  # noqa: ANN001
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="x", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=MSGS)
    bad_key = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_unknown_extra_fields_are_tolerated(server) -> None:  # noqa: ANN001
    body = {"prompt": "Hi", "max_tokens": 2, "some_future_field": {"x": 1}}
    resp = httpx.post(server.url + CMPL, json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1


def _wait_for(predicate, timeout: float = 20.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_disconnect_mid_stream_frees_kv_blocks(server) -> None:  # noqa: ANN001
    assert _wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0)
    aborted_before = server.metric("vllm:request_success_total", finished_reason="abort")
    body = {"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", server.url + CMPL, json=body, headers=AUTH, timeout=60) as resp:
        assert resp.status_code == 200
        received = 0
        for line in resp.iter_lines():
            received += line.startswith("data: {")
            if received == 3:
                # Still connected: the request is running and holds KV blocks.
                assert server.metric("vllm:kv_cache_usage_perc") > 0.0
                assert server.metric("vllm:num_requests_running") == 1.0
                break  # leaving the line iterator closes the connection
    # The connection is closed: the request is aborted and its blocks freed at once.
    assert _wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0, timeout=10)
    assert server.metric("vllm:num_requests_running") == 0.0
    after = server.metric("vllm:request_success_total", finished_reason="abort")
    assert after == aborted_before + 1
    assert httpx.get(f"{server.url}/health").status_code == 200
