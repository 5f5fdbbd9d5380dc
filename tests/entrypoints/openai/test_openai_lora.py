"""`minivllm serve --enable-lora --lora-modules ...`: two adapters and the base model
served at once, selected by the request's ``model`` (streaming and not), listed by
/v1/models with their parent, a 404 naming the choices for an unknown name, and
adapters loaded and unloaded at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lora_helpers import write_random_adapter
from server_utils import MODEL_NAME, RemoteServer

from minivllm.config.model import ModelConfig

PORT = 18411
PROMPT = "The capital of France is"
BODY = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("adapters")
    hf_config = ModelConfig().hf_text_config  # the default model the server runs
    return {
        "attn": write_random_adapter(
            tmp / "attn", hf_config, r=8, target_modules=["q_proj", "v_proj", "o_proj"], seed=1
        ),
        "mlp": write_random_adapter(
            tmp / "mlp", hf_config, r=16, target_modules=["gate_proj", "up_proj"], seed=2
        ),
        "late": write_random_adapter(
            tmp / "late", hf_config, r=8, target_modules=["down_proj"], seed=3
        ),
    }


@pytest.fixture(scope="module")
def lora_server(adapters) -> Iterator[RemoteServer]:
    mlp = {"name": "mlp", "path": str(adapters["mlp"]), "base_model_name": MODEL_NAME}
    remote = RemoteServer(
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
        "--lora-modules", f"attn={adapters['attn']}", json.dumps(mlp),
        max_model_len=512, num_gpu_blocks=64, port=PORT,
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    )  # fmt: skip
    try:
        remote.wait_ready()
        yield remote
    finally:
        remote.stop()


def complete(server: RemoteServer, model: str) -> tuple[str, list[float]]:
    """The completion's text and its tokens' log-probabilities."""
    body = {**BODY, "model": model}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model
    choice = response.json()["choices"][0]
    return str(choice["text"]), [round(x, 3) for x in choice["logprobs"]["token_logprobs"]]


def stream(server: RemoteServer, model: str) -> str:
    pieces = []
    body = {**BODY, "model": model, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(pieces)


def test_model_selects_the_adapter_streaming_or_not(lora_server) -> None:
    outs = {m: complete(lora_server, m) for m in (MODEL_NAME, "attn", "mlp")}
    # Each adapter changes the output (its log-probabilities at least).
    assert len({tuple(logprobs) for _, logprobs in outs.values()}) == 3, outs
    assert stream(lora_server, "attn") == outs["attn"][0]
    assert stream(lora_server, MODEL_NAME) == outs[MODEL_NAME][0]
    chat = httpx.post(
        f"{lora_server.url}/v1/chat/completions",
        json={"model": "mlp", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=300,
    )
    assert chat.status_code == 200 and chat.json()["model"] == "mlp"


def test_models_lists_adapters_with_their_parent(lora_server) -> None:
    cards = {c["id"]: c for c in httpx.get(f"{lora_server.url}/v1/models").json()["data"]}
    assert {"attn", "mlp", MODEL_NAME} <= set(cards)
    assert cards["attn"]["parent"] == MODEL_NAME == cards["mlp"]["parent"]
    assert cards[MODEL_NAME]["parent"] is None


def test_an_unknown_model_is_a_404_naming_the_choices(lora_server) -> None:
    body = {**BODY, "model": "nope"}
    response = httpx.post(f"{lora_server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "nope" in message and "attn" in message and "mlp" in message and MODEL_NAME in message


def test_load_and_unload_at_run_time(lora_server, adapters) -> None:
    url = lora_server.url
    load = {"lora_name": "late", "lora_path": str(adapters["late"])}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
    again = httpx.post(f"{url}/v1/load_lora_adapter", json=load)
    assert again.status_code == 400 and "already been loaded" in again.text
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/no"})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert complete(lora_server, "late") != complete(lora_server, MODEL_NAME)
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"})
    assert gone.status_code == 200
    after = httpx.post(f"{url}/v1/completions", json={**BODY, "model": "late"}, timeout=60)
    assert after.status_code == 404
    missing = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"})
    assert missing.status_code == 404


def test_lora_requests_info_metric(lora_server) -> None:
    text = httpx.get(f"{lora_server.url}/metrics").text
    assert "vllm:lora_requests_info{" in text
    assert 'max_lora="2"' in text
