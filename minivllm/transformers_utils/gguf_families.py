"""Per-family pieces of mapping GGUF metadata onto transformers configs: rope
scaling (linear, YaRN) and what llama.cpp leaves implicit for Gemma 3.

``get(name, default)`` reads ``{architecture}.{name}`` from the file's metadata.
"""

from __future__ import annotations

from typing import Any


def gguf_rope_parameters(get: Any) -> dict[str, Any]:
    """transformers' ``rope_parameters`` from llama.cpp's ``rope.*`` keys."""
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(get("rope.freq_base", 10000.0)),
    }
    scaling = get("rope.scaling.type")
    if scaling in ("linear", "yarn") and get("rope.scaling.factor"):
        rope["rope_type"] = scaling
        rope["factor"] = float(get("rope.scaling.factor"))
        original = get("rope.scaling.original_context_length")
        if original:
            rope["original_max_position_embeddings"] = int(original)
        if scaling == "yarn":
            # llama.cpp names the YaRN knobs yarn_*; transformers drops the prefix.
            for gguf_key, hf_key in (
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
                ("rope.scaling.yarn_attn_factor", "attention_factor"),
            ):
                value = get(gguf_key)
                if value:
                    rope[hf_key] = float(value)
    elif scaling not in (None, "none"):
        raise ValueError(
            f"GGUF rope scaling type {scaling!r} is not supported; supported: linear, yarn"
        )
    return rope


GEMMA3_END_OF_TURN_ID = 106
"""``<end_of_turn>``: Gemma 3 ends a chat turn with it, so generation stops there too."""


def gemma3_kwargs(get: Any, kwargs: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 settings that llama.cpp keeps implicit in its code, not in the file.

    Five local (sliding-window, rope base 10k) layers per global one; the global
    layers take the file's rope base and scaling.  Queries are scaled by the head
    size except in the 27B model (62 layers), which uses hidden_size / heads.
    """
    head_dim = kwargs["head_dim"]
    scalar = head_dim
    if kwargs["num_hidden_layers"] == 62:
        scalar = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    eos = kwargs["eos_token_id"]
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if GEMMA3_END_OF_TURN_ID < kwargs["vocab_size"] and GEMMA3_END_OF_TURN_ID not in eos_ids:
        eos_ids.append(GEMMA3_END_OF_TURN_ID)
    return {
        "sliding_window": int(get("attention.sliding_window", 4096)),
        "query_pre_attn_scalar": scalar,
        "hidden_activation": "gelu_pytorch_tanh",
        "eos_token_id": eos_ids,
        "rope_parameters": {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
