"""Qwen3: the Llama decoder with a per-head RMSNorm on q and k."""

from __future__ import annotations

from typing import Any

from minivllm.model_executor.models.llama import AttnOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense causal LM (q_norm / k_norm before rotary)."""

    @classmethod
    def attn_options(cls, config: Any) -> AttnOptions:
        # getattr: the HF config carries these fields only when the checkpoint sets them.
        if getattr(config, "use_sliding_window", False):
            raise ValueError("Qwen3 sliding-window attention is not supported; disable it")
        bias = bool(getattr(config, "attention_bias", False))
        return AttnOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)
