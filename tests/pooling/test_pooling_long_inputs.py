"""``PoolerConfig.enable_chunked_processing`` / ``max_embed_len``: an embedding input
longer than max_model_len runs as chunks whose embeddings are averaged (vLLM's
aggregation), checked against the same computation done chunk by chunk with HF
transformers (`chunked_reference`); over max_embed_len it is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM
from minivllm.pooling_params import PoolingParams
from tests.pooling.pooling_helpers import WORDS, chunked_reference, save_bert

MAX_LEN = 16
LONG = " ".join([*WORDS, "the", "cat", "sat"])
"""36 tokens with [CLS] and [SEP]: chunks of 16, 16 and 4 tokens."""
SHORT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("bert")
    return path, save_bert(path)


def _llm(path: Path, pooling: str) -> LLM:
    pooler = {"pooling_type": pooling, "enable_chunked_processing": True, "max_embed_len": 40}
    return LLM(
        str(path), dtype="float32", optimization_level=0, max_model_len=MAX_LEN,
        pooler_config=pooler,
    )  # fmt: skip


@pytest.mark.parametrize("pooling", ["MEAN", "CLS"])
def test_long_input_is_the_token_weighted_mean_of_its_chunks(
    bert: tuple[Path, Any], pooling: str
) -> None:
    path, hf = bert
    llm = _llm(path, pooling)
    long_ids = llm.get_tokenizer()(LONG)["input_ids"]
    short_ids = llm.get_tokenizer()(SHORT)["input_ids"]
    assert len(long_ids) > 2 * MAX_LEN
    outs = llm.embed([LONG, SHORT], use_tqdm=False)
    assert outs[0].prompt_token_ids == long_ids  # the whole input, not a chunk
    got = torch.tensor(outs[0].outputs.embedding)
    expected = chunked_reference(hf, long_ids, MAX_LEN, pooling)
    assert F.cosine_similarity(got, expected, dim=0) > 1 - 1e-4
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    # An input that fits runs as one request, as without chunked processing.
    short = torch.tensor(outs[1].outputs.embedding)
    torch.testing.assert_close(short, chunked_reference(hf, short_ids, MAX_LEN, pooling))
    if pooling == "MEAN":
        raw = llm.embed(LONG, PoolingParams(normalize=False), use_tqdm=False)[0]
        expected = chunked_reference(hf, long_ids, MAX_LEN, pooling, normalize=False)
        torch.testing.assert_close(torch.tensor(raw.outputs.embedding), expected)
    with pytest.raises(ValueError, match="maximum embedding input length of 40"):
        llm.embed(LONG + " " + LONG, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
