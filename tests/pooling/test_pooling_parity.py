"""Pooling models against independent references, on tiny random checkpoints:
sentence-transformers (BERT with CLS / MEAN pooling, a Qwen3 embedder with LAST
pooling) and HF transformers (sequence classifiers' probabilities and scores).

Every check also runs the prompts one at a time and in one mixed-length batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM
from minivllm.pooling_params import PoolingParams
from tests.pooling.pooling_helpers import save_bert, save_decoder

pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import (  # noqa: E402
    Normalize,
    Pooling,
    Transformer,
)

TEXTS = [
    "the cat sat on the mat",
    "blue sky",
    "the dog swims in the river and the fish swims in the sea",
    "paris is the capital city of france",
    "red",
    "what bird flies fast over the green tree",
]
QUERY = "where is the capital of france"
ENGINE = dict(dtype="float32", optimization_level=0, num_gpu_blocks_override=256)
COS_TOL = 1e-4


def _sentence_transformer(src: Path, dst: Path, mode: str) -> SentenceTransformer:
    """A sentence-transformers model over ``src`` with ``mode`` pooling, saved to ``dst``
    (modules.json + 1_Pooling/config.json, which minivllm reads)."""
    body = Transformer(str(src))
    st = SentenceTransformer(
        modules=[body, Pooling(body.get_embedding_dimension(), mode), Normalize()],
        device="cpu",
    )
    st.save(str(dst))
    return st


def _check_embeddings(llm: LLM, reference: torch.Tensor) -> None:
    batched = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    cosine = F.cosine_similarity(batched, reference.float(), dim=-1)
    assert cosine.min().item() > 1 - COS_TOL, cosine
    assert torch.allclose(batched.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    alone = torch.tensor([llm.embed(t, use_tqdm=False)[0].outputs.embedding for t in TEXTS])
    torch.testing.assert_close(alone, batched, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bert")
    save_bert(path)
    return path


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_bert_matches_sentence_transformers(bert_dir: Path, tmp_path: Path, mode: str) -> None:
    st = _sentence_transformer(bert_dir, tmp_path / "st", mode)
    reference = st.encode(TEXTS, convert_to_tensor=True)
    llm = LLM(str(tmp_path / "st"), **ENGINE)
    config = llm.llm_engine.vllm_config
    assert config.model_config.pooler_config.pooling_type == mode.upper()
    # Bidirectional prompts run whole: no chunked prefill, no prefix cache.
    assert not config.scheduler_config.enable_chunked_prefill
    assert not config.cache_config.enable_prefix_caching
    _check_embeddings(llm, reference)


def test_bert_many_prompts_in_padded_groups(bert_dir: Path, tmp_path: Path) -> None:
    """More prompts than one attention group (16) of many lengths, against
    sentence-transformers."""
    import random

    from tests.pooling.pooling_helpers import WORDS

    rng = random.Random(0)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(40)]
    st = _sentence_transformer(bert_dir, tmp_path / "st", "mean")
    reference = st.encode(texts, convert_to_tensor=True)
    llm = LLM(str(tmp_path / "st"), **ENGINE)
    got = torch.tensor([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)])
    assert F.cosine_similarity(got, reference.float()).min().item() > 1 - COS_TOL


def test_matryoshka_dimensions_truncate_then_normalize(bert_dir: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    hf = AutoModel.from_pretrained(bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(bert_dir)
    with torch.no_grad():
        cls = hf(**tok(TEXTS[0], return_tensors="pt")).last_hidden_state[0, 0]
    llm = LLM(str(bert_dir), **ENGINE)
    out = llm.embed(TEXTS[0], PoolingParams(dimensions=16), use_tqdm=False)[0]
    expected = F.normalize(cls[:16], dim=0)
    assert F.cosine_similarity(torch.tensor(out.outputs.embedding), expected, dim=0) > 1 - COS_TOL
    assert abs(torch.tensor(out.outputs.embedding).norm().item() - 1) < 1e-5
    raw = llm.embed(TEXTS[0], PoolingParams(normalize=False), use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(raw.outputs.embedding), cls, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("architecture", "config_name"), [("Qwen3Model", "Qwen3Config"), ("LlamaModel", "LlamaConfig")]
)
def test_decoder_embedder_matches_sentence_transformers(
    tmp_path: Path, architecture: str, config_name: str
) -> None:
    save_decoder(tmp_path / "hf", architecture, config_name)
    st = _sentence_transformer(tmp_path / "hf", tmp_path / "st", "lasttoken")
    reference = st.encode(TEXTS, convert_to_tensor=True)
    # A tiny token budget forces chunked prefill of the longer prompts.
    llm = LLM(str(tmp_path / "st"), max_num_batched_tokens=8, max_num_seqs=4, **ENGINE)
    assert llm.llm_engine.vllm_config.model_config.pooler_config.pooling_type == "LAST"
    _check_embeddings(llm, reference)


def test_prefix_cache_hit_gives_the_same_last_token_embedding(tmp_path: Path) -> None:
    """Causal LAST pooling keeps prefix caching on: a repeated prompt reuses its
    blocks and only its last token is recomputed, to the same embedding."""
    save_decoder(tmp_path)
    llm = LLM(str(tmp_path), **ENGINE)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    long_text = " ".join([TEXTS[2]] * 3)  # 39 tokens: two full blocks of 16
    first = llm.encode(long_text, pooling_task="embed", use_tqdm=False)[0]
    again = llm.encode(long_text, pooling_task="embed", use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 32
    torch.testing.assert_close(again.outputs.data, first.outputs.data, atol=1e-5, rtol=1e-5)


def test_causal_mean_pooling_over_chunks(tmp_path: Path) -> None:
    """MEAN pooling keeps the rows of every chunk of a chunked prompt."""
    save_decoder(tmp_path / "hf")
    st = _sentence_transformer(tmp_path / "hf", tmp_path / "st", "mean")
    reference = st.encode(TEXTS, convert_to_tensor=True)
    llm = LLM(str(tmp_path / "st"), max_num_batched_tokens=8, max_num_seqs=4, **ENGINE)
    _check_embeddings(llm, reference)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("cls")
    hf = save_decoder(path, "Qwen3ForSequenceClassification", num_labels=3)
    return path, hf


def _hf_logits(hf: torch.nn.Module, ids: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([hf(torch.tensor([i])).logits for i in ids])


def test_classifier_matches_transformers(classifier: tuple[Path, torch.nn.Module]) -> None:
    path, hf = classifier
    llm = LLM(str(path), max_num_batched_tokens=8, max_num_seqs=4, **ENGINE)
    assert llm.llm_engine.vllm_config.model_config.convert_type == "classify"
    tok = llm.get_tokenizer()
    expected = _hf_logits(hf, [tok(t)["input_ids"] for t in TEXTS]).softmax(-1)
    probs = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS, use_tqdm=False)])
    torch.testing.assert_close(probs, expected, atol=1e-4, rtol=0)
    alone = torch.tensor([llm.classify(t, use_tqdm=False)[0].outputs.probs for t in TEXTS])
    torch.testing.assert_close(alone, probs, atol=1e-5, rtol=0)
    raw = llm.classify(TEXTS[0], PoolingParams(use_activation=False), use_tqdm=False)[0]
    torch.testing.assert_close(
        torch.tensor(raw.outputs.probs), _hf_logits(hf, [tok(TEXTS[0])["input_ids"]])[0],
        atol=1e-4, rtol=0,
    )  # fmt: skip


def test_reward_scores_every_token(classifier: tuple[Path, torch.nn.Module]) -> None:
    path, hf = classifier
    llm = LLM(str(path), pooler_config={"pooling_type": "ALL"}, **ENGINE)
    ids = llm.get_tokenizer()(TEXTS[2])["input_ids"]
    with torch.no_grad():
        hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
        expected = hf.score(hidden).softmax(-1)
    out = llm.reward({"prompt_token_ids": ids}, use_tqdm=False)[0]
    torch.testing.assert_close(out.outputs.data, expected, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="pooling_type"):
        LLM(str(path), **ENGINE).reward(TEXTS[0])


def test_cross_encoder_scores_and_ranking(tmp_path: Path) -> None:
    hf = save_decoder(tmp_path, "LlamaForSequenceClassification", "LlamaConfig", num_labels=1)
    llm = LLM(str(tmp_path), **ENGINE)
    tok = llm.get_tokenizer()
    pairs = [tok(QUERY, doc)["input_ids"] for doc in TEXTS]
    expected = torch.sigmoid(_hf_logits(hf, pairs)[:, 0])
    scores = torch.tensor([o.outputs.score for o in llm.score(QUERY, TEXTS, use_tqdm=False)])
    torch.testing.assert_close(scores, expected, atol=1e-4, rtol=0)
    assert scores.argsort().tolist() == expected.argsort().tolist()


def test_embedding_model_scores_by_cosine(bert_dir: Path) -> None:
    llm = LLM(str(bert_dir), **ENGINE)
    embeds = torch.tensor([o.outputs.embedding for o in llm.embed([QUERY, *TEXTS], use_tqdm=False)])
    expected = embeds[1:] @ embeds[0]
    scores = torch.tensor([o.outputs.score for o in llm.score(QUERY, TEXTS, use_tqdm=False)])
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
