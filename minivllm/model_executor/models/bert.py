"""BERT encoder (``BertModel``): bidirectional attention, post-norm layers, GELU MLP;
and ``BertForSequenceClassification`` (a cross-encoder reranker / classifier).

Runs with the pooling runner only: ``forward(input_ids [T], positions [T]) -> hidden
[T, H]`` over a flat batch of whole prompts; attention sees the whole prompt
(`Attention` with ``attn_type="encoder_only"``, no KV cache).  A token's type (1 for
the second text of a pair) rides in the high bits of its id (`TOKEN_TYPE_SHIFT`).
The pooler (CLS / MEAN, normalization) is applied by the runner; the classifier's
pooler and head run in ``pooling_head`` on the pooled CLS states.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.attention.encoder_only import ENCODER_ONLY
from minivllm.attention.layer import Attention
from minivllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear
from minivllm.model_executor.models.utils import (
    StackedMapping,
    load_weights_stacked,
    maybe_prefix,
    set_default_torch_dtype,
)
from minivllm.pooling_params import TOKEN_TYPE_SHIFT

BERT_STACKED_PARAMS: StackedMapping = [
    (".self.qkv_proj", ".self.query", "q"),
    (".self.qkv_proj", ".self.key", "k"),
    (".self.qkv_proj", ".self.value", "v"),
]
"""HF BERT's separate q/k/v projections, held stacked in one matrix."""


class BertEmbeddings(nn.Module):
    """Word + absolute position + token type embeddings, then LayerNorm."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        token_types = input_ids >> TOKEN_TYPE_SHIFT
        ids = input_ids & ((1 << TOKEN_TYPE_SHIFT) - 1)
        hidden = self.word_embeddings(ids) + self.position_embeddings(positions)
        return self.LayerNorm(hidden + self.token_type_embeddings(token_types))


class BertDenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: the output of BERT's attention and MLP."""

    def __init__(self, in_size: int, config: Any) -> None:
        super().__init__()
        self.dense = ReplicatedLinear(in_size, config.hidden_size, bias=True)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertSelfAttention(nn.Module):
    """Stacked q/k/v projection and bidirectional attention within each prompt."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        heads = config.num_attention_heads
        self.head_dim = config.hidden_size // heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, heads, bias=True)
        self.q_size = heads * self.head_dim
        self.attn = Attention(
            heads, self.head_dim, self.head_dim**-0.5, prefix=prefix, attn_type=ENCODER_ONLY
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size] * 3, dim=-1)
        return self.attn(q, k, v)


class BertAttention(nn.Module):
    """Self-attention then its output projection with the post-norm residual."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.self = BertSelfAttention(config, maybe_prefix(prefix, "self.attn"))
        self.output = BertDenseNorm(config.hidden_size, config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    """The MLP's up projection and GELU (erf form, as HF's "gelu")."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        if config.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported BERT hidden_act {config.hidden_act!r}; use 'gelu'")
        self.approximate = "none" if config.hidden_act == "gelu" else "tanh"
        self.dense = ReplicatedLinear(config.hidden_size, config.intermediate_size, bias=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden), approximate=self.approximate)


class BertLayer(nn.Module):
    """One post-norm encoder layer."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.attention = BertAttention(config, maybe_prefix(prefix, "attention"))
        self.intermediate = BertIntermediate(config)
        self.output = BertDenseNorm(config.intermediate_size, config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.attention(hidden)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    """The stack of encoder layers (HF's ``encoder.layer.{i}`` names)."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            BertLayer(config, maybe_prefix(prefix, f"layer.{i}"))
            for i in range(config.num_hidden_layers)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertModel(nn.Module):
    """BERT as an embedding model: the last layer's hidden states for the pooler."""

    is_encoder_only = True
    """Attention is bidirectional: prompts run whole (no chunked prefill)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype = torch.float32, prefix: str = ""):
        super().__init__()
        if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with absolute position embeddings is supported")
        self.config = hf_config
        self.dtype = dtype
        with set_default_torch_dtype(dtype):
            self.embeddings = BertEmbeddings(hf_config)
            self.encoder = BertEncoder(hf_config, maybe_prefix(prefix, "encoder"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden_size] of a flat batch of whole prompts."""
        return self.encoder(self.embeddings(input_ids, positions))

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """What follows pooling: nothing for an embedding model."""
        return pooled

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (``bert.`` prefix or none); BERT's own pooler (a
        dense + tanh for next-sentence prediction) and MLM heads are not used."""
        renamed = ((self._param_name(n), t) for n, t in weights)
        kept = ((n, t) for n, t in renamed if n is not None)
        return load_weights_stacked(self, kept, BERT_STACKED_PARAMS)

    def _param_name(self, name: str) -> str | None:
        """This model's name for a checkpoint tensor, or None to skip it."""
        name = name.removeprefix("bert.")
        if name.startswith(("embeddings.", "encoder.")) and "position_ids" not in name:
            return name
        return None


class BertForSequenceClassification(BertModel):
    """A BERT classifier (cross-encoder): the encoder, then on the pooled CLS state
    BERT's pooler (dense + tanh) and the ``classifier`` linear layer (HF's names)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype = torch.float32, prefix: str = ""):
        super().__init__(hf_config, dtype=dtype, prefix=prefix)
        hidden = hf_config.hidden_size
        with set_default_torch_dtype(dtype):
            self.pooler = nn.Linear(hidden, hidden)
            self.classifier = nn.Linear(hidden, hf_config.num_labels)

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled CLS states [N, H] -> float32 logits [N, num_labels]."""
        x = torch.tanh(self.pooler(pooled.to(self.pooler.weight.dtype)))
        return self.classifier(x).float()

    def _param_name(self, name: str) -> str | None:
        """The encoder's tensors, plus ``bert.pooler.dense`` and ``classifier``."""
        short = name.removeprefix("bert.")
        if short.startswith(("pooler.dense.", "classifier.")):
            return short.replace("pooler.dense.", "pooler.")
        return super()._param_name(name)
