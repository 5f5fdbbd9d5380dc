"""Token embedding, LM head and the logits computation.

Given quantized GGUF blocks (`GGUFWeight`), the embedding keeps the raw blocks
and expands only the rows it looks up (exactly the file's values), and the LM
head computes on a low-bit copy (`quantized_linear`) and recomputes each row's
top logits exactly from the blocks.  The blocks kept are the file's own pages,
mapped (`GGUFWeight.stored`): a lookup or a top-logit row reads its few pages,
and the table is not held in memory a second time beside the head's low-bit copy
(Gemma 3's tied 262k x 640 Q8_0 table: 178 MB).  Where the head's kernel computes
on a Q8_0 table's own codes and float16 scales (`quantized_linear.q8_0_native`),
the lookup and the exact top logits read those same tensors.  A tied pair shares
one parameter, so the blocks ride on that parameter until both have taken them.
With ``quantization="int8_per_channel"`` the head is quantized to int8 at load
(`ParallelLMHead.quantize_int8`) and the embedding stays float; the top logits
are recomputed from the float table when the two are tied, else from the int8
codes in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from torch import nn

from minivllm.model_executor.layers import cpu_gemm
from minivllm.model_executor.layers.gguf_blocks import GGUFWeight, gather_rows, scaled_rows
from minivllm.model_executor.layers.quantized_linear import (
    PLAIN_TABLE,
    lowbit_logits,
    q8_0_native,
    quantize_parts,
    refine_top_logits,
)
from minivllm.model_executor.layers.utils import default_weight_loader, make_param
from minivllm.torch_ops import register_op

_GGUF_ATTR = "gguf_weight"
"""Attribute of a parameter holding the `GGUFWeight` it was given."""


def gguf_embedding_impl(
    ids: torch.Tensor, table: torch.Tensor, qtype: int, dim: int
) -> torch.Tensor:
    """Rows ``ids`` of a quantized table ``uint8 [vocab, row_bytes]``, as float32."""
    return gather_rows(table, ids, qtype, dim).view(*ids.shape, dim)


def _gguf_embedding_fake(
    ids: torch.Tensor, table: torch.Tensor, qtype: int, dim: int
) -> torch.Tensor:
    return table.new_empty(*ids.shape, dim, dtype=torch.float32)


gguf_embedding = register_op("gguf_embedding", gguf_embedding_impl, _gguf_embedding_fake)


class VocabParallelEmbedding(nn.Module):
    """Lookup table ``[num_embeddings, embedding_dim]`` (not sharded: TP size is 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = make_param(num_embeddings, embedding_dim)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.register_buffer("qtable", None, persistent=False)
        self.register_buffer("table_scales", None, persistent=False)
        """Scales of ``qtable``'s int8 rows (one a row, or per 32 inputs: Q8_0's);
        None when ``qtable`` holds float rows or raw GGUF blocks."""
        self.qtype = 0
        self.out_dtype = self.weight.dtype

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor | GGUFWeight) -> None:
        """Copy a float table in; keep quantized GGUF blocks on the parameter."""
        if isinstance(loaded, GGUFWeight):
            setattr(param, _GGUF_ATTR, loaded)
            return
        default_weight_loader(param, loaded)

    def process_weights_after_loading(self, dtype: torch.dtype) -> None:
        """Take the kept GGUF blocks as the lookup table; drop the float parameter."""
        source = getattr(self.weight, _GGUF_ATTR, None)
        if source is None:
            return
        self.out_dtype = dtype
        self._take_table(source)
        self.weight = None  # type: ignore[assignment]

    def _take_table(self, source: GGUFWeight) -> None:
        """``source`` as the exact table: a Q8_0 one as the codes and scales that the
        head's kernel computes on, where it does (`q8_0_native`); any other as the
        file's blocks, mapped (`GGUFWeight.stored`), so the table costs no memory of
        its own beside the low-bit copy the head computes on."""
        if source.qtype == GGMLQuantizationType.Q8_0 and q8_0_native([source]):
            self.qtable, self.table_scales = source.q8_0_parts()
            self.qtype = PLAIN_TABLE
        else:
            self.qtable, self.qtype = source.stored(), int(source.qtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.table_scales is not None:
            flat = input_ids.reshape(-1)
            rows = scaled_rows(self.qtable[flat], self.table_scales[flat])
            return rows.view(*input_ids.shape, -1).to(self.out_dtype)
        if self.qtable is not None:
            if torch.compiler.is_compiling():
                rows = gguf_embedding(input_ids, self.qtable, self.qtype, self.embedding_dim)
            else:
                rows = gguf_embedding_impl(input_ids, self.qtable, self.qtype, self.embedding_dim)
            return rows.to(self.out_dtype)
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection to the vocabulary; may share its weight with the embedding."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.use_packed_gemm = False
        """Set by `cpu_gemm.pack_linear_weights` once the weight is packed for oneDNN."""
        self.quant_kind = 0
        self.register_buffer("qweight", None, persistent=False)
        self.register_buffer("qscales", None, persistent=False)
        self.tied = False
        """Whether the weight is the embedding's (`tie_weights`)."""

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        """Use the embedding table as the output projection (``tie_word_embeddings``)."""
        self.weight = embed_tokens.weight
        self.tied = True

    def process_weights_after_loading(self, dtype: torch.dtype) -> None:
        """Compute on a low-bit copy of kept GGUF blocks; drop the float parameter.

        The raw blocks stay too (``qtable``, the embedding's own tensor when the
        two are tied, so no extra memory): the top logits are recomputed from them.
        A Q8_0 head's kernel computes on its codes and scales, the same tensors.
        """
        source = getattr(self.weight, _GGUF_ATTR, None)
        if source is None:
            return
        self.quant_kind, self.qweight, self.qscales = quantize_parts([source], lm_head=True)
        self._take_table(source)
        self.weight = None  # type: ignore[assignment]

    def quantize_int8(self) -> None:
        """Compute on int8 codes with one scale per vocabulary row; drop the float
        weight unless it is the (tied) embedding's, which then serves the exact
        top logits (no extra memory: the lookup keeps it anyway)."""
        if self.quant_kind or self.weight is None:
            return
        weight = self.weight.detach()
        self.quant_kind, self.qweight, self.qscales = quantize_parts([weight])
        self.qtype = PLAIN_TABLE
        self.qtable = weight if self.tied else self.qweight
        self.table_scales = None if self.tied else self.qscales
        self.weight = None  # type: ignore[assignment]

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
        if lm_head.quant_kind:
            q = (lm_head.qweight, lm_head.qscales)
            logits = lowbit_logits(hidden_states, *q, lm_head.quant_kind)
            table, scales = lm_head.qtable, lm_head.table_scales
            refine_top_logits(hidden_states, logits, table, lm_head.qtype, scales)
        elif lm_head.use_packed_gemm:
            logits = cpu_gemm.linear(hidden_states, lm_head.weight, None).float()
        else:
            logits = F.linear(hidden_states, lm_head.weight).float()
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits[..., : self.vocab_size]
