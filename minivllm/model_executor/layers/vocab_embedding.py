"""Token embedding, LM head and the logits computation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model_executor.layers import cpu_gemm
from minivllm.model_executor.layers.utils import default_weight_loader, make_param


class VocabParallelEmbedding(nn.Module):
    """Lookup table ``[num_embeddings, embedding_dim]`` (not sharded: TP size is 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = make_param(num_embeddings, embedding_dim)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection to the vocabulary; may share its weight with the embedding."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.use_packed_gemm = False
        """Set by `cpu_gemm.pack_linear_weights` once the weight is packed for oneDNN."""

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        """Use the embedding table as the output projection (``tie_word_embeddings``)."""
        self.weight = embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied through LogitsProcessor, not called")


class LogitsProcessor(nn.Module):
    """Projects hidden states to float32 logits, optionally rescaled and soft-capped."""

    def __init__(self, vocab_size: int, scale: float = 1.0, soft_cap: float | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = scale
        self.soft_cap = soft_cap

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        if lm_head.use_packed_gemm:
            logits = cpu_gemm.linear(hidden_states, lm_head.weight, None).float()
        else:
            logits = F.linear(hidden_states, lm_head.weight).float()
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits[..., : self.vocab_size]
