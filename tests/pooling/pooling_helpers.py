"""Tiny random pooling checkpoints (BERT, Qwen3/Llama embedders, sequence classifiers)
with a small word-level tokenizer, saved to a directory the test gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from model_helpers import TINY_CONFIG

WORDS = (
    "the a cat dog sat on mat sun is hot cold blue sky sea fish swims bird flies "
    "what where who paris france capital city river tree green red fast slow"
).split()
"""The tokenizer's words (every test sentence is made of them)."""

BERT_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    type_vocab_size=2,
)
DECODER_CONFIG: dict[str, Any] = {k: v for k, v in TINY_CONFIG.items() if k != "vocab_size"}
"""The other tests' tiny decoder; the vocabulary comes from the test's tokenizer."""


def save_bert_tokenizer(path: Path) -> Any:
    """A WordPiece BERT tokenizer over `WORDS` ([CLS] ... [SEP], pairs with token types)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tok = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    tok.save_pretrained(path)
    return tok


def save_decoder_tokenizer(path: Path) -> Any:
    """A word-level fast tokenizer over `WORDS` that appends an EOS token (as
    Qwen3-Embedding's does), padding on the left."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(
        single="$A <eos>", pair="$A <eos> $B <eos>", special_tokens=[("<eos>", 2)]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tok.padding_side = "left"
    tok.save_pretrained(path)
    return tok


def _randomize_vectors(model: torch.nn.Module) -> None:
    """Norm weights and biases away from 1 and 0, so a test comparing outputs sees them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + ("norm" in name.lower()))


def save_bert(path: Path, architecture: str = "BertModel", seed: int = 0, **kw: Any) -> Any:
    """A random BERT encoder (``BertModel``) with its tokenizer; returns the HF model."""
    torch.manual_seed(seed)
    tok = save_bert_tokenizer(path)
    cfg = transformers.BertConfig(
        **{**BERT_CONFIG, **kw}, vocab_size=len(tok), architectures=[architecture]
    )
    model = getattr(transformers, architecture)(cfg).eval()
    _randomize_vectors(model)
    model.save_pretrained(path)
    return model


def save_decoder(
    path: Path,
    architecture: str = "Qwen3Model",
    config_name: str = "Qwen3Config",
    seed: int = 0,
    **kw: Any,
) -> Any:
    """A random decoder (``Qwen3Model``, ``LlamaForSequenceClassification``, ...) with
    a word-level tokenizer; returns the HF model."""
    torch.manual_seed(seed)
    tok = save_decoder_tokenizer(path)
    cfg = getattr(transformers, config_name)(
        **{**DECODER_CONFIG, **kw},
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        architectures=[architecture],
    )
    model = getattr(transformers, architecture)(cfg).eval()
    _randomize_vectors(model)
    model.save_pretrained(path)
    return model


def chunked_reference(
    hf_bert: Any, token_ids: list[int], max_len: int, pooling: str, normalize: bool = True
) -> torch.Tensor:
    """vLLM's chunked embedding of ``token_ids``, computed with HF transformers: each
    chunk of ``max_len`` tokens run alone (MEAN or CLS pooled, then normalized), the
    chunks averaged weighted by their token counts, then normalized again."""
    total = torch.zeros(hf_bert.config.hidden_size)
    with torch.no_grad():
        for i in range(0, len(token_ids), max_len):
            chunk = token_ids[i : i + max_len]
            hidden = hf_bert(input_ids=torch.tensor([chunk])).last_hidden_state[0]
            pooled = hidden.mean(dim=0) if pooling == "MEAN" else hidden[0]
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=0)
            total += pooled * len(chunk)
    mean = total / len(token_ids)
    return torch.nn.functional.normalize(mean, dim=0) if normalize else mean
