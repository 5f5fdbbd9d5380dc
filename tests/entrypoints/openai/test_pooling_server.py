"""The pooling endpoints of ``minivllm serve --runner pooling``, with the official
`openai` client for /v1/embeddings (float and base64) and httpx for the rest; every
bad input is a 4xx naming the problem.  References: the offline `LLM` API (itself
checked against sentence-transformers and HF in tests/pooling)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest
import torch
import torch.nn.functional as F
from server_utils import API_KEY, RemoteServer, all_ready

from minivllm import LLM
from tests.pooling.pooling_helpers import save_bert, save_decoder

PORTS = iter(range(18150, 18199))
"""This branch's ports (servers started here never share one)."""
TEXTS = ["the cat sat on the mat", "blue sky", "paris is the capital city of france"]
QUERY = "where is the capital of france"


def _serve(model: Path, *args: str, max_model_len: int) -> RemoteServer:
    with mock.patch("server_utils.free_port", return_value=next(PORTS)):
        # float32 on every CPU: the replies are compared with float32 references.
        return RemoteServer(
            "--model", str(model), "--dtype", "float32", *args, max_model_len=max_model_len
        )


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    save_bert(root / "bert")
    save_decoder(root / "reranker", "Qwen3ForSequenceClassification", num_labels=1)
    return {name: root / name for name in ("bert", "reranker")}


@pytest.fixture(scope="module")
def servers(model_dirs: dict[str, Path]) -> Iterator[dict[str, RemoteServer]]:
    started = {
        "bert": _serve(model_dirs["bert"], "--runner", "pooling", max_model_len=128),
        "reranker": _serve(model_dirs["reranker"], max_model_len=256),
    }
    with all_ready(started):
        yield started


@pytest.fixture(scope="module")
def reference(model_dirs: dict[str, Path]) -> torch.Tensor:
    llm = LLM(str(model_dirs["bert"]), dtype="float32", optimization_level=0)
    return torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])


def _post(server: RemoteServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_openai_client_embeddings_float_and_base64(
    servers: dict[str, RemoteServer], reference: torch.Tensor
) -> None:
    import numpy as np
    import openai

    client = openai.OpenAI(base_url=f"{servers['bert'].url}/v1", api_key="x", max_retries=0)
    floats = client.embeddings.create(model=None, input=TEXTS, encoding_format="float")
    got = torch.tensor([d.embedding for d in floats.data])
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert F.cosine_similarity(got, reference).min() > 1 - 1e-4
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)
    # The client asks for base64 by default and decodes the float32 bytes itself.
    packed = client.embeddings.create(model=None, input=TEXTS[1])
    decoded = torch.tensor(np.array(packed.data[0].embedding), dtype=torch.float32)
    assert torch.allclose(decoded, reference[1], atol=1e-5)
    short = client.embeddings.create(model=None, input=TEXTS[0], dimensions=8)
    expected = F.normalize(_raw_cls(servers["bert"], TEXTS[0])[:8], dim=0)
    assert torch.allclose(torch.tensor(short.data[0].embedding), expected, atol=1e-5)


def _raw_cls(server: RemoteServer, text: str) -> torch.Tensor:
    body = {"input": text, "normalize": False}
    return torch.tensor(_post(server, "/pooling", body).json()["data"][0]["data"])


def test_token_id_inputs_and_pooling(servers: dict[str, RemoteServer]) -> None:
    server = servers["bert"]
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": TEXTS[0]}).json()["tokens"]
    one = _post(server, "/v1/embeddings", {"input": ids}).json()["data"][0]["embedding"]
    many = _post(server, "/v1/embeddings", {"input": [ids, ids[:3]]}).json()["data"]
    assert many[0]["embedding"] == pytest.approx(one, abs=1e-6) and len(many) == 2
    pooled = _post(server, "/v1/pooling", {"input": TEXTS[0]}).json()
    assert pooled["data"][0]["data"] == pytest.approx(one, abs=1e-6)


def test_embedding_model_scores_and_reranks_by_cosine(
    servers: dict[str, RemoteServer], reference: torch.Tensor
) -> None:
    server = servers["bert"]
    scores = _post(server, "/score", {"text_1": TEXTS[0], "text_2": TEXTS}).json()["data"]
    expected = (reference @ reference[0]).tolist()
    assert [d["score"] for d in scores] == pytest.approx(expected, abs=1e-4)
    ranked = _post(server, "/v1/rerank", {"query": TEXTS[0], "documents": TEXTS}).json()
    order = [r["index"] for r in ranked["results"]]
    assert order == sorted(range(3), key=lambda i: -expected[i])
    assert ranked["results"][0]["document"]["text"] == TEXTS[order[0]]


def test_cross_encoder_rerank_orders_documents_by_score(
    servers: dict[str, RemoteServer], model_dirs: dict[str, Path]
) -> None:
    server = servers["reranker"]
    llm = LLM(str(model_dirs["reranker"]), dtype="float32", optimization_level=0)
    expected = [o.outputs.score for o in llm.score(QUERY, TEXTS, use_tqdm=False)]
    body = {"model": None, "query": QUERY, "documents": TEXTS, "top_n": 2}
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        results = _post(server, path, body).json()["results"]
        assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -expected[i])[:2]
        assert [r["relevance_score"] for r in results] == pytest.approx(
            sorted(expected, reverse=True)[:2], abs=1e-4
        )
    scores = _post(server, "/v1/score", {"text_1": QUERY, "text_2": TEXTS}).json()["data"]
    assert [d["score"] for d in scores] == pytest.approx(expected, abs=1e-4)
    probs = _post(server, "/classify", {"input": TEXTS}).json()["data"]
    assert all(len(p["probs"]) == 1 and 0 < p["probs"][0] < 1 for p in probs)


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/embeddings", {"input": []}, 400, "empty list"),
        ("/v1/embeddings", {"input": ["the cat", ""]}, 400, "input[1] is an empty string"),
        ("/v1/embeddings", {"input": "the " * 200}, 400, "maximum context length"),
        ("/v1/embeddings", {"input": "the cat", "dimensions": 65}, 400, "dimensions=65"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ("/v1/embeddings", {"input": "the cat", "model": "other"}, 404, "does not exist"),
        ("/classify", {"input": "the cat"}, 400, "does not serve the 'classify' task"),
        ("/rerank", {"query": "a", "documents": []}, 400, "documents is empty"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "equal length"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_problem(
    servers: dict[str, RemoteServer], path: str, body: dict, status: int, words: str
) -> None:
    response = _post(servers["bert"], path, body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_a_generation_model_refuses_embeddings_naming_the_runner(server: RemoteServer) -> None:
    # The shared server of the OpenAI tests (conftest.py) runs the default chat model.
    response = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": "the cat"},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert response.status_code == 400
    assert "--runner pooling" in response.json()["error"]["message"]


def test_bench_serve_embeddings_mode(
    servers: dict[str, RemoteServer], model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    import json

    from minivllm.entrypoints.cli.main import main

    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", servers["bert"].url, "--disable-tqdm"]
    argv += ["--endpoint", "/v1/embeddings", "--tokenizer", str(model_dirs["bert"])]
    argv += ["--num-prompts", "6", "--input-len", "16", "--output-json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert (r["completed"], r["failed"]) == (6, 0)
    # The server's usage counts the prompts; nothing is generated.
    assert r["total_input_tokens"] == 6 * 16 and r["total_output_tokens"] == 0
    assert r["request_throughput"] > 0 and r["total_token_throughput"] > 0
