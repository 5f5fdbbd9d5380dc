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

from minivllm.distributed import get_pp_group
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.block_form import PRE_NORM_SWIGLU
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.rotary_attention import RotaryAttention
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
    """SwiGLU MLP with the gate and up projections stacked in one matrix."""

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


class LlamaAttention(RotaryAttention):
    """Stacked QKV projection, rotary embedding, paged attention, output projection
    (`RotaryAttention` with the family's options)."""

    def __init__(
        self, config: Any, rotary_emb: RotaryEmbedding, opts: AttnOptions, prefix: str
    ) -> None:
        head_dim = head_dim_of(config)
        eps = config.rms_norm_eps
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim,
            rotary_emb,
            scale=head_dim**-0.5,
            prefix=prefix,
            qkv_bias=opts.qkv_bias,
            o_bias=opts.o_bias,
            qk_norm=(lambda size: RMSNorm(size, eps)) if opts.qk_norm else None,
        )


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention + MLP block; carries the residual stream through the norms."""

    block_form = PRE_NORM_SWIGLU
    """What the layer computes (`minivllm.model_executor.layers.block_form`)."""

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
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


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
    the last sends ``hidden + residual`` on (the next layer's add-norm would
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
        for layer in self.layers[self.start_layer : self.end_layer]:
            hidden, residual = layer(positions, hidden, residual)
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
