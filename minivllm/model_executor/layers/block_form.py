"""Names for what a decoder layer computes, which a model declares on its layer
class (``block_form``).

A transform applied from outside the model (the CPU decode graph's fused layers,
`minivllm.model_executor.layers.fused_decoder_layer`) replaces a layer only when
the layer says it computes exactly what the replacement does; the model itself
knows nothing of the transform.
"""

from __future__ import annotations

PRE_NORM_SWIGLU = "pre_norm_swiglu"
"""``forward(positions, hidden, residual) -> (mlp_out, residual)``: ``input_layernorm``
(adding ``residual`` first when given), ``self_attn`` (``qkv_proj``, optional
``q_norm``/``k_norm``, ``rotary_emb``, ``attn``, ``o_proj``),
``post_attention_layernorm`` adding the residual, and ``mlp`` (``gate_up_proj``,
``act_fn``, ``down_proj``).  Llama's layer, reused by Qwen2 and Qwen3."""

SANDWICH_GEGLU = "sandwich_geglu"
"""``forward(positions, hidden) -> hidden``: ``input_layernorm``, ``self_attn``
(``qkv_proj``, optional ``q_norm``/``k_norm``, ``rotary_emb``, ``attn``,
``o_proj``), ``post_attention_layernorm`` on the attention output, the residual
add, ``pre_feedforward_layernorm``, ``mlp`` (``gate_up_proj``, ``act_fn``,
``down_proj``), ``post_feedforward_layernorm`` on the MLP output and the residual
add.  Gemma 3's layer."""

__all__ = ["PRE_NORM_SWIGLU", "SANDWICH_GEGLU"]
