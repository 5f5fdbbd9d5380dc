"""The attention block the decoder models share: a stacked QKV projection, an
optional per-head norm on q and k, the rotary embedding, paged attention and the
output projection.

Llama-family models (Llama, Qwen2, Qwen3) and Gemma 3 differ only in the
arguments: biases, whether and which q/k norm, the query scale, a sliding
window.  Under tensor parallelism each rank holds its share of the heads (KV
heads replicated when there are fewer than ranks); the projections are built
whole and sharded by the loader (`minivllm.model_executor.layers.tensor_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minivllm.attention.layer import Attention
from minivllm.distributed import get_tp_group
from minivllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding


class RotaryAttention(nn.Module):
    """``o_proj(attention(rotary(norm(q)), rotary(norm(k)), v))`` over the paged KV
    cache, with q, k and v from one ``qkv_proj``.

    ``qk_norm`` makes the per-head norm of q and k from the head size (None: no
    norm); ``sliding_window``: keys a query sees (None: the whole context).
    """

    def __init__(
        self,
        hidden_size: int,
        total_heads: int,
        total_kv_heads: int,
        head_dim: int,
        rotary_emb: RotaryEmbedding,
        *,
        scale: float,
        prefix: str,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: Callable[[int], nn.Module] | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        tp_size = get_tp_group().world_size
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv_heads // tp_size)
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size, head_dim, total_heads, total_kv_heads, qkv_bias
        )
        self.o_proj = RowParallelLinear(total_heads * head_dim, hidden_size, o_bias)
        self.rotary_emb = rotary_emb
        self.q_norm: nn.Module | None = qk_norm(head_dim) if qk_norm else None
        self.k_norm: nn.Module | None = qk_norm(head_dim) if qk_norm else None
        self.attn = Attention(
            self.num_heads,
            head_dim,
            scale,
            self.num_kv_heads,
            prefix=f"{prefix}.attn" if prefix else "attn",
            sliding_window=sliding_window,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            t = q.shape[0]
            q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim)).view(t, self.q_size)
            k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous()))


__all__ = ["RotaryAttention"]
