"""``minivllm serve -tp 2 --enable-lora``: an adapter loaded at run time
(``/v1/load_lora_adapter``) reaches both ranks and gives peft's log-probabilities;
unloaded, it is gone.  The offline TP tests (test_lora_tp.py) cover the same
sharded forward faster; this one adds the HTTP path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lora_helpers import peft_reference, save_peft_adapter
from model_helpers import save_random_hf_model
from server_utils import RemoteServer, all_ready

from tests.pooling.pooling_helpers import WORDS, save_decoder_tokenizer

pytestmark = pytest.mark.slow  # a TP=2 server; test_lora_tp.py covers the forward

PORT = 18160
PROMPT = list(range(5, 30))
NUM_TOKENS = 5


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lora_tp_server")
    hf, _ = save_random_hf_model(
        tmp / "base", num_key_value_heads=1, tie_word_embeddings=False, vocab_size=len(WORDS) + 3
    )  # the tokenizer's vocabulary: every sampled token decodes
    save_decoder_tokenizer(tmp / "base")
    targets = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
    peft = save_peft_adapter(hf, tmp / "late", r=8, target_modules=targets, seed=7)
    return {
        "base": tmp / "base",
        "adapter": tmp / "late",
        "want": peft_reference(peft, PROMPT, NUM_TOKENS)[1],
        "base_want": peft_reference(hf, PROMPT, NUM_TOKENS)[1],
    }


@pytest.fixture(scope="module")
def server(model: dict[str, Any]) -> Iterator[RemoteServer]:
    remote = RemoteServer(
        "--model", str(model["base"]), "--served-model-name", "tiny",
        "-tp", "2", "--dtype", "float32", "--enable-lora", "--max-lora-rank", "8",
        max_model_len=128, num_gpu_blocks=64, port=PORT,
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    )  # fmt: skip
    with all_ready({"tp2": remote}):
        yield remote


def _logprobs(server: RemoteServer, name: str) -> list[float]:
    body = {
        "model": name,
        "prompt": PROMPT,
        "max_tokens": NUM_TOKENS,
        "temperature": 0,
        "logprobs": 1,
    }
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def test_adapter_loaded_at_run_time_serves_on_both_ranks(
    server: RemoteServer, model: dict[str, Any]
) -> None:
    url = server.url
    load = {"lora_name": "late", "lora_path": str(Path(model["adapter"]))}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
    assert _logprobs(server, "late") == pytest.approx(model["want"], abs=1e-3)
    assert _logprobs(server, "tiny") == pytest.approx(model["base_want"], abs=1e-3)
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}).is_success
    gone = httpx.post(f"{url}/v1/completions", json={"model": "late", "prompt": PROMPT})
    assert gone.status_code == 404
