"""``minivllm serve`` with chunked processing (the `openai` client embeds an input
longer than max_model_len; over max_embed_len is a 400 naming it) and with a BERT
cross-encoder (/score and /rerank against HF transformers' scores)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import transformers
from server_utils import RemoteServer, all_ready

from tests.pooling.pooling_helpers import WORDS, chunked_reference, save_bert

PORTS = iter(range(18200, 18249))
"""This test file's ports."""
MAX_LEN = 16
LONG = " ".join([*WORDS, "the", "cat", "sat"])
QUERY = "where is the capital of france"
DOCS = ["the cat sat on the mat", "paris is the capital city of france", "blue sky"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    root = tmp_path_factory.mktemp("serve-long")
    embedder = save_bert(root / "bert")
    reranker = save_bert(
        root / "rerank", "BertForSequenceClassification", num_labels=1, initializer_range=0.3
    )
    return {"bert": (root / "bert", embedder), "rerank": (root / "rerank", reranker)}


def _serve(model: Path, *args: str, max_model_len: int) -> Iterator[RemoteServer]:
    remote = RemoteServer(  # float32 on every CPU: compared with float32 references
        "--model", str(model), "--dtype", "float32", *args,
        max_model_len=max_model_len, port=next(PORTS),
    )  # fmt: skip
    with all_ready({"server": remote}):
        yield remote


@pytest.fixture(scope="module")
def chunking_server(models: dict[str, tuple[Path, Any]]) -> Iterator[RemoteServer]:
    pooler = {"pooling_type": "MEAN", "enable_chunked_processing": True, "max_embed_len": 40}
    yield from _serve(
        models["bert"][0], "--pooler-config", json.dumps(pooler), max_model_len=MAX_LEN
    )


@pytest.fixture(scope="module")
def rerank_server(models: dict[str, tuple[Path, Any]]) -> Iterator[RemoteServer]:
    yield from _serve(models["rerank"][0], max_model_len=128)


def test_openai_client_embeds_an_input_longer_than_the_context(
    chunking_server: RemoteServer, models: dict[str, tuple[Path, Any]]
) -> None:
    import openai

    path, hf = models["bert"]
    ids = transformers.AutoTokenizer.from_pretrained(path)(LONG)["input_ids"]
    assert len(ids) > 2 * MAX_LEN
    client = openai.OpenAI(base_url=f"{chunking_server.url}/v1", api_key="x", max_retries=0)
    out = client.embeddings.create(model=None, input=[LONG, "blue sky"], encoding_format="float")
    got = torch.tensor(out.data[0].embedding)
    torch.testing.assert_close(got, chunked_reference(hf, ids, MAX_LEN, "MEAN"))
    assert out.usage.prompt_tokens == len(ids) + 4  # the whole input, and [CLS] blue sky [SEP]
    with pytest.raises(openai.BadRequestError, match="maximum embedding input length of 40"):
        client.embeddings.create(model=None, input=f"{LONG} {LONG}")


@pytest.mark.slow  # tests/pooling/test_bert_cross_encoder.py checks the scores offline
def test_bert_cross_encoder_scores_and_reranks(
    rerank_server: RemoteServer, models: dict[str, tuple[Path, Any]]
) -> None:
    path, hf = models["rerank"]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        logits = hf(**tok([QUERY] * 3, DOCS, padding=True, return_tensors="pt")).logits
    expected = torch.sigmoid(logits[:, 0]).tolist()
    url = rerank_server.url
    body = {"query": QUERY, "documents": DOCS}
    results = httpx.post(f"{url}/v1/rerank", json=body, timeout=60).json()["results"]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -expected[i])
    assert [r["relevance_score"] for r in results] == pytest.approx(
        sorted(expected, reverse=True), abs=1e-4
    )
    body = {"text_1": QUERY, "text_2": DOCS}
    scores = httpx.post(f"{url}/score", json=body, timeout=60).json()["data"]
    assert [d["score"] for d in scores] == pytest.approx(expected, abs=1e-4)
