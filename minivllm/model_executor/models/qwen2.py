"""Qwen2: the Llama decoder with biases on the q/k/v projections."""

from __future__ import annotations

from typing import Any

from minivllm.model_executor.models.llama import AttnOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5 causal LM (sliding-window attention is not supported)."""

    @classmethod
    def attn_options(cls, config: Any) -> AttnOptions:
        # getattr: the HF config carries these fields only when the checkpoint sets them.
        if getattr(config, "use_sliding_window", False):
            raise ValueError("Qwen2 sliding-window attention is not supported; disable it")
        return AttnOptions(qkv_bias=True, o_bias=False)
