"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral); Qwen2/Qwen3 reuse it.

Models take a flat batch: ``forward(input_ids [T], positions [T]) -> hidden [T, H]``.
Attention metadata comes from the forward context, not from arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minivllm.attention.decode_graph import DECODE_INPUTS, decode_layer_boundary
from minivllm.attention.layer import Attention
from minivllm.distributed import get_pp_group, get_tp_group
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.fused_decoder_layer import (
    LayerParts,
    fusable,
    fused_decoder_layer,
    fused_decoder_stack,
)
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from minivllm.model_executor.layers.rotary_embedding import (
    RotaryEmbedding,
    get_rope,
    rope_parameters_from_config,
)
from minivllm.model_executor.layers.vocab_embedding import (
    LogitsProcessor,
    ParallelLMHead,
    VocabParallelEmbedding,
)
from minivllm.model_executor.models.utils import (
    LLAMA_STACKED_PARAMS,
    load_weights_stacked,
    maybe_prefix,
    set_default_torch_dtype,
)


@dataclass(frozen=True)
class AttnOptions:
    """How a model family's attention block differs from Llama's."""

    qkv_bias: bool = False
    """Bias on the q/k/v projections."""
    o_bias: bool = False
    """Bias on the output projection."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k before rotary (Qwen3)."""


def head_dim_of(config: Any) -> int:
    """Head size: ``config.head_dim`` when given, else hidden_size / num_heads."""
    # getattr here and below: optional fields of an HF config differ by model family.
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaMLP(nn.Module):
    """SwiGLU MLP with the gate and up projections fused."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}; only 'silu' is")
        bias = bool(getattr(config, "mlp_bias", False))
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    """Fused QKV projection, rotary embedding, paged attention, output projection."""

    def __init__(
        self, config: Any, rotary_emb: RotaryEmbedding, opts: AttnOptions, prefix: str
    ) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        # This rank's heads under tensor parallelism (KV heads replicated when fewer
        # than ranks); the projections are built whole and sharded by the loader.
        tp_size = get_tp_group().world_size
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv_heads // tp_size)
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, total_heads, total_kv_heads, opts.qkv_bias
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, config.hidden_size, opts.o_bias
        )
        self.rotary_emb = rotary_emb
        if opts.qk_norm:
            self.q_norm: RMSNorm | None = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm: RMSNorm | None = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            self.num_kv_heads,
            prefix=maybe_prefix(prefix, "attn"),
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


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention + MLP block; carries the residual stream through the norms."""

    def __init__(
        self, config: Any, rotary_emb: RotaryEmbedding, opts: AttnOptions, prefix: str
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = LlamaAttention(
            config, rotary_emb, opts, prefix=maybe_prefix(prefix, "self_attn")
        )
        self.mlp = LlamaMLP(config, prefix=maybe_prefix(prefix, "mlp"))
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fuses(hidden):
            # CPU decode graph: the whole layer as one C++ call.
            return fused_decoder_layer(positions, hidden, residual, *self.fused_parts())
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def fused_parts(self) -> LayerParts:
        """``(norms, linears, attn, rotary)``: what the fused C++ layer reads."""
        attn = self.self_attn
        norms = (self.input_layernorm, self.post_attention_layernorm)
        linears = (attn.qkv_proj, attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)
        return norms, linears, attn.attn, attn.rotary_emb

    def fuses(self, hidden: torch.Tensor) -> bool:
        """Whether this layer runs as one fused C++ call in the trace under way
        (`minivllm.model_executor.layers.fused_decoder_layer`)."""
        if not DECODE_INPUTS.tracing:  # every eager forward asks: answer without work
            return False
        return fusable(hidden, *self.fused_parts(), self.self_attn.q_norm is not None)


class PPMissingLayer(nn.Identity):
    """Stands for a decoder layer that lives on another pipeline stage."""


def pp_layer_range(num_layers: int) -> tuple[int, int]:
    """``[start, end)`` of the decoder layers on this pipeline stage (even split)."""
    pp = get_pp_group()
    per_stage = num_layers // pp.world_size
    return pp.rank_in_group * per_stage, (pp.rank_in_group + 1) * per_stage


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm (no LM head).

    Under pipeline parallelism a stage holds only its layers; a stage other than the
    first receives the residual stream from the one before, and a stage other than
    the last sends ``hidden + residual`` on (the next layer's fused add-norm would
    form exactly that sum) and returns it in place of the final hidden states.
    """

    def __init__(self, config: Any, opts: AttnOptions, prefix: str = "") -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # One rotary table shared by every layer: it can be tens of MB for long contexts.
        head_dim = head_dim_of(config)
        rotary_emb = get_rope(
            head_dim,
            head_dim,
            config.max_position_embeddings,
            rope_parameters_from_config(config),
        )
        self.start_layer, self.end_layer = pp_layer_range(config.num_hidden_layers)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, rotary_emb, opts, prefix=maybe_prefix(prefix, f"layers.{i}"))
            if self.start_layer <= i < self.end_layer
            else PPMissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pp = get_pp_group()
        if pp.is_first_rank:
            hidden = self.embed_tokens(input_ids)
        else:
            width, dtype = self.norm.weight.shape[0], self.norm.weight.dtype
            hidden = pp.recv(input_ids, width, dtype, pp.prev_rank)
        residual = None
        layers = self.layers[self.start_layer : self.end_layer]
        stack = None
        if len(layers) and all(layer.fuses(hidden) for layer in layers):
            # CPU decode graph, every layer fusable: all of them as one C++ call.
            stack = fused_decoder_stack(positions, hidden, [lay.fused_parts() for lay in layers])
        if stack is not None:
            hidden, residual = stack
        else:
            for i, layer in enumerate(layers):
                hidden, residual = layer(positions, hidden, residual)
                hidden = decode_layer_boundary(hidden, i, fused=layer.fuses(hidden))
        if not pp.is_last_rank:
            stream = hidden if residual is None else hidden + residual
            return pp.send(stream, pp.next_rank)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Causal LM: `LlamaModel` plus an LM head (tied to the embedding or not).

    Construct with ``LlamaForCausalLM(hf_config, dtype=torch.bfloat16)``, inside
    ``with set_current_vllm_config(cfg):`` when a config should steer the custom
    ops and collect the attention layers.
    """

    supports_parallel = True
    """Heads split over tensor-parallel ranks, layers over pipeline stages (see
    `LlamaAttention`, `LlamaModel`); the loader refuses models without this flag."""

    @classmethod
    def attn_options(cls, config: Any) -> AttnOptions:
        """Attention variations of this family, read from the HF config."""
        bias = bool(getattr(config, "attention_bias", False))
        return AttnOptions(qkv_bias=bias, o_bias=bias)

    def __init__(self, hf_config: Any, *, dtype: torch.dtype = torch.float32, prefix: str = ""):
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        with set_default_torch_dtype(dtype):
            self.model = LlamaModel(
                hf_config, self.attn_options(hf_config), prefix=maybe_prefix(prefix, "model")
            )
            self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
            if hf_config.tie_word_embeddings:
                self.lm_head.tie_weights(self.model.embed_tokens)
            self.logits_processor = LogitsProcessor(hf_config.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden_size] of a flat batch of T tokens."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] for the selected hidden rows [N, hidden_size]."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; returns the names of the parameters filled."""
        tied = bool(self.config.tie_word_embeddings)
        other_stages = tuple(
            f"model.layers.{i}."
            for i, layer in enumerate(self.model.layers)
            if isinstance(layer, PPMissingLayer)
        )
        return load_weights_stacked(
            self,
            weights,
            LLAMA_STACKED_PARAMS,
            skip_prefixes=(("lm_head.",) if tied else ()) + other_stages,
            optional_params=("lm_head.weight",) if tied else (),
        )
