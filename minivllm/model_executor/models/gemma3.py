"""Gemma 3 text decoder (``Gemma3ForCausalLM``, e.g. the 270M and 1B models).

How it differs from Llama: RMSNorm scales by ``1 + weight`` and runs in float32;
four norms per layer (before and after attention and MLP); a GeGLU MLP with
tanh-approximated GELU; per-head RMSNorm on q and k; the embedding is multiplied
by ``sqrt(hidden_size)``; queries are scaled by ``query_pre_attn_scalar ** -0.5``;
local layers attend to a sliding window and use their own rope base (10k), global
layers see the whole context with the model's rope base and scaling.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from minivllm.model_executor.layers.activation import GeluAndMul
from minivllm.model_executor.layers.block_form import SANDWICH_GEGLU
from minivllm.model_executor.layers.layernorm import GemmaRMSNorm
from minivllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.rotary_attention import RotaryAttention
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
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

SLIDING = "sliding_attention"
FULL = "full_attention"


def gemma3_layer_types(config: Any) -> list[str]:
    """``sliding_attention`` / ``full_attention`` per layer (every 6th is global by default)."""
    # getattr: older configs carry only sliding_window_pattern, newer ones layer_types.
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    pattern = int(getattr(config, "sliding_window_pattern", 6))
    return [SLIDING if (i + 1) % pattern else FULL for i in range(config.num_hidden_layers)]


def gemma3_rope_parameters(config: Any, layer_type: str) -> dict[str, Any]:
    """Rope settings of one layer type (transformers 5 nests them per type)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type in params:
        out = dict(params[layer_type])
    elif layer_type == SLIDING:
        out = {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", 1e4)}
    else:
        out = {k: v for k, v in params.items() if not isinstance(v, dict)}
        out.setdefault("rope_theta", getattr(config, "rope_theta", 1e6))
        scaling = getattr(config, "rope_scaling", None)
        if scaling:
            out.update(scaling)
    out.setdefault("rope_type", out.get("type", "default"))
    return out


class Gemma3MLP(nn.Module):
    """GeGLU MLP: ``down(gelu_tanh(gate(x)) * up(x))``, gate and up stacked."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"unsupported Gemma 3 activation {act!r}; only gelu_pytorch_tanh is")
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], False)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, False)
        self.act_fn = GeluAndMul(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Gemma3Attention(RotaryAttention):
    """QKV projection, q/k norms, the layer type's rotary embedding, paged attention
    (`RotaryAttention`), queries scaled by ``query_pre_attn_scalar ** -0.5``."""

    def __init__(
        self, config: Any, rotary_emb: RotaryEmbedding, sliding_window: int | None, prefix: str
    ) -> None:
        if getattr(config, "attn_logit_softcapping", None):
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        bias = bool(getattr(config, "attention_bias", False))
        eps = config.rms_norm_eps
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            rotary_emb,
            scale=config.query_pre_attn_scalar**-0.5,
            prefix=prefix,
            qkv_bias=bias,
            o_bias=bias,
            qk_norm=lambda size: GemmaRMSNorm(size, eps),
            sliding_window=sliding_window,
        )


class Gemma3DecoderLayer(nn.Module):
    """Sandwich-norm block: norm, attention, norm, add; norm, MLP, norm, add."""

    block_form = SANDWICH_GEGLU
    """What the layer computes (`minivllm.model_executor.layers.block_form`)."""

    def __init__(
        self, config: Any, rotary_emb: RotaryEmbedding, sliding_window: int | None, prefix: str
    ) -> None:
        super().__init__()
        eps, size = config.rms_norm_eps, config.hidden_size
        self.self_attn = Gemma3Attention(
            config, rotary_emb, sliding_window, maybe_prefix(prefix, "self_attn")
        )
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(hidden))
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


class Gemma3Model(nn.Module):
    """Scaled embedding, decoder layers (local and global), final norm."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # HF rounds the scale to the model dtype before multiplying; so do we.
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5), persistent=False)
        head_dim = config.head_dim
        max_pos = config.max_position_embeddings
        ropes = {
            t: get_rope(head_dim, head_dim, max_pos, gemma3_rope_parameters(config, t))
            for t in (SLIDING, FULL)
        }
        layers = []
        for i, layer_type in enumerate(gemma3_layer_types(config)):
            window = config.sliding_window if layer_type == SLIDING else None
            layers.append(
                Gemma3DecoderLayer(
                    config, ropes[layer_type], window, maybe_prefix(prefix, f"layers.{i}")
                )
            )
        self.layers = nn.ModuleList(layers)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * self.normalizer.to(hidden.dtype)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class Gemma3ForCausalLM(nn.Module):
    """Gemma 3 causal LM; the LM head is the embedding table (tied)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype = torch.float32, prefix: str = ""):
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        with set_default_torch_dtype(dtype):
            self.model = Gemma3Model(hf_config, prefix=maybe_prefix(prefix, "model"))
            self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
            self.lm_head.tie_weights(self.model.embed_tokens)
            soft_cap = getattr(hf_config, "final_logit_softcapping", None)
            self.logits_processor = LogitsProcessor(hf_config.vocab_size, soft_cap=soft_cap)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden_size] of a flat batch of T tokens."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] for the selected hidden rows [N, hidden_size]."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (an ``lm_head.weight`` is ignored: the head is tied)."""
        return load_weights_stacked(
            self,
            weights,
            LLAMA_STACKED_PARAMS,
            skip_prefixes=("lm_head.",),
            optional_params=("lm_head.weight",),
        )
