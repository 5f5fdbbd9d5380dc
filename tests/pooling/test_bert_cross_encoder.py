"""``BertForSequenceClassification`` as a cross-encoder (``LLM.score``) and a
classifier (``LLM.classify``) against HF transformers and sentence-transformers'
CrossEncoder: each pair runs with its tokenizer's token types (the second text is
type 1), so scores and rankings match the references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from minivllm import LLM
from minivllm.pooling_params import PoolingParams
from tests.pooling.pooling_helpers import save_bert

QUERY = "where is the capital of france"
DOCS = [
    "paris is the capital city of france",
    "the cat sat on the mat",
    "the fish swims in the blue sea",
    "what bird flies over the green tree",
    "france",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, LLM]:
    path = tmp_path_factory.mktemp("bert-reranker")
    # Larger random weights than BERT's 0.02: scores spread out and token types matter.
    hf = save_bert(path, "BertForSequenceClassification", num_labels=1, initializer_range=0.3)
    llm = LLM(str(path), dtype="float32", optimization_level=0)
    return path, hf, llm


def _hf_scores(path: Path, hf: Any, first: list[str], second: list[str]) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(first, second, padding=True, return_tensors="pt")
    assert batch["token_type_ids"].any()  # the pairs' second texts are type 1
    with torch.no_grad():
        return torch.sigmoid(hf(**batch).logits[:, 0])


def test_scores_and_ranking_match_transformers(reranker: tuple[Path, Any, LLM]) -> None:
    path, hf, llm = reranker
    config = llm.llm_engine.vllm_config.model_config
    assert (config.convert_type, config.pooler_config.pooling_type) == ("classify", "CLS")
    got = torch.tensor([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    expected = _hf_scores(path, hf, [QUERY] * len(DOCS), DOCS)
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    assert got.argsort().tolist() == expected.argsort().tolist()
    # One pair at a time gives the batch's scores.
    alone = [llm.score(QUERY, d, use_tqdm=False)[0].outputs.score for d in DOCS]
    torch.testing.assert_close(torch.tensor(alone), got, atol=1e-5, rtol=0)


def test_sentence_transformers_cross_encoder(reranker: tuple[Path, Any, LLM]) -> None:
    st = pytest.importorskip("sentence_transformers")
    path, _, llm = reranker
    cross = st.CrossEncoder(str(path), device="cpu", local_files_only=True)
    expected = torch.tensor(cross.predict([(QUERY, d) for d in DOCS]))  # sigmoid of 1 label
    got = torch.tensor([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


def test_truncation_keeps_the_pairs_token_types(reranker: tuple[Path, Any, LLM]) -> None:
    path, hf, llm = reranker
    tok = transformers.AutoTokenizer.from_pretrained(path)
    pair = tok(QUERY, DOCS[0])
    keep = len(pair["input_ids"]) - 3  # cuts into the query (the first text)
    out = llm.score(QUERY, DOCS[0], PoolingParams(truncate_prompt_tokens=keep), use_tqdm=False)
    inputs = {k: torch.tensor([v[-keep:]]) for k, v in pair.items()}
    positions = torch.arange(keep)[None]
    with torch.no_grad():
        logits = hf(**inputs, position_ids=positions).logits
    assert abs(out[0].outputs.score - torch.sigmoid(logits[0, 0]).item()) < TOL


def test_single_texts_classify_like_transformers(reranker: tuple[Path, Any, LLM]) -> None:
    path, hf, llm = reranker
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(DOCS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(hf(**batch).logits)
    got = torch.tensor([o.outputs.probs for o in llm.classify(DOCS, use_tqdm=False)])
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
