"""The `Attention` layer and the two torch custom ops it runs through.

``forward(q, k, v)`` calls ``minivllm::unified_kv_cache_update`` (write this
step's K/V into the paged cache) and ``minivllm::unified_attention_with_output``
(attention into a preallocated output).  Both take the layer *name* and find the
layer through ``get_forward_context().no_compile_layers``, so a compiled graph
sees two opaque ops it can split at; the cache-update op returns an empty tensor
that the attention op consumes, which keeps the two ordered in a traced graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from minivllm.attention.backends import get_attn_backend
from minivllm.attention.encoder_only import ENCODER_ONLY, encoder_only_attention
from minivllm.attention.forward_context import get_forward_context
from minivllm.attention.metadata import metadata_for_layer
from minivllm.attention.ops import compute_kv_scale
from minivllm.attention.paged_kv import is_fp8
from minivllm.config.cache import CacheConfig
from minivllm.config.vllm import get_current_vllm_config_or_none
from minivllm.torch_ops import register_op


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged KV cache.

    ``kv_cache`` is bound by the model runner (see `bind_kv_caches`);
    ``kv_cache_dtype`` / ``calculate_kv_scales`` default to the current config's
    ``cache_config`` (``"auto"`` / False without one).  For fp8 caches
    ``k_scale``/``v_scale`` (float32 scalars, 1.0 by default) divide K/V before
    the cast; with ``calculate_kv_scales`` they are set once from the first
    batch that has attention metadata.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        prefix: str = "",
        kv_cache_dtype: str | None = None,
        calculate_kv_scales: bool | None = None,
        backend: str | None = None,
        sliding_window: int | None = None,
        attn_type: str = "decoder",
    ) -> None:
        super().__init__()
        if attn_type not in ("decoder", ENCODER_ONLY):
            raise ValueError(f"attn_type must be 'decoder' or {ENCODER_ONLY!r}, got {attn_type!r}")
        self.attn_type = attn_type
        """"decoder" (causal, over the paged KV cache) or "encoder_only" (bidirectional
        within each prompt of the step; nothing is written to the cache)."""
        if not prefix:
            raise ValueError("Attention needs a unique prefix (its layer name)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.layer_name = prefix
        # Unset arguments come from the config being built; a layer made outside one
        # (unit tests) takes CacheConfig's defaults.
        cfg = get_current_vllm_config_or_none()
        cache_cfg = cfg.cache_config if cfg is not None else CacheConfig()
        if kv_cache_dtype is None:
            kv_cache_dtype = cache_cfg.cache_dtype
        if calculate_kv_scales is None:
            calculate_kv_scales = cache_cfg.calculate_kv_scales
        model_cfg = cfg.model_config if cfg is not None else None
        if model_cfg is not None and model_cfg.disable_sliding_window:
            sliding_window = None  # every layer attends to the whole context
        if sliding_window is not None and sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        self.sliding_window = sliding_window
        """Keys a query sees (itself and the ``sliding_window - 1`` before it); None: all."""
        self.kv_cache_dtype = kv_cache_dtype
        self.calculate_kv_scales = calculate_kv_scales
        self.kv_scales_computed = False
        self.register_buffer("k_scale", torch.tensor(1.0, dtype=torch.float32), persistent=False)
        self.register_buffer("v_scale", torch.tensor(1.0, dtype=torch.float32), persistent=False)
        self.kv_cache: torch.Tensor | None = None
        self.kv_group = 0
        """KV cache group (see `minivllm.kv_cache.groups`), set with the cache binding."""
        self.impl = get_attn_backend(backend)
        if cfg is not None:
            ctx = cfg.compilation_config.static_forward_context
            if prefix in ctx:
                raise ValueError(f"duplicate attention layer name {prefix!r}")
            ctx[prefix] = self

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Attention of flat ``query [T, nh*hd]`` given ``key/value [T, nkv*hd]``."""
        output = torch.empty_like(query)
        if torch.compiler.is_compiling():
            dep = torch.ops.minivllm.unified_kv_cache_update(key, value, self.layer_name)
            torch.ops.minivllm.unified_attention_with_output(
                query, key, value, output, self.layer_name, dep
            )
        else:
            # Eager: skip the custom-op dispatcher (tens of microseconds per call).
            dep = unified_kv_cache_update_impl(key, value, self.layer_name)
            unified_attention_with_output_impl(query, key, value, output, self.layer_name, dep)
        return output

    def maybe_compute_kv_scales(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """Set k/v scales from the first real batch when ``calculate_kv_scales`` is on."""
        if not self.calculate_kv_scales or self.kv_scales_computed:
            return
        assert self.kv_cache is not None
        if is_fp8(self.kv_cache.dtype):
            self.k_scale.copy_(compute_kv_scale(key, self.kv_cache.dtype))
            self.v_scale.copy_(compute_kv_scale(value, self.kv_cache.dtype))
        self.kv_scales_computed = True

    def extra_repr(self) -> str:
        return (
            f"name={self.layer_name}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
            f"head_size={self.head_size}, kv_cache_dtype={self.kv_cache_dtype}"
            + (f", sliding_window={self.sliding_window}" if self.sliding_window else "")
        )


def _lookup(layer_name: str) -> Attention:
    ctx = get_forward_context()
    try:
        return ctx.no_compile_layers[layer_name]
    except KeyError:
        raise RuntimeError(
            f"attention layer {layer_name!r} is not in the forward context; pass the "
            "config's static_forward_context (or get_attention_layers(model)) as "
            "no_compile_layers to set_forward_context"
        ) from None


def unified_kv_cache_update_impl(
    key: torch.Tensor, value: torch.Tensor, layer_name: str
) -> torch.Tensor:
    """Write this step's K/V into the layer's cache (no-op without metadata)."""
    ctx = get_forward_context()
    attn_metadata = ctx.attn_metadata
    if attn_metadata is not None:
        layer = _lookup(layer_name)
        if layer.attn_type == ENCODER_ONLY:
            return torch.empty(0, dtype=key.dtype, device=key.device)
        if layer.kv_cache is None:
            raise RuntimeError(
                f"{layer_name}: no KV cache bound; call bind_kv_caches before running "
                "with attention metadata"
            )
        attn_metadata = metadata_for_layer(attn_metadata, layer)
        t = attn_metadata.num_actual_tokens
        k = key[:t].view(t, layer.num_kv_heads, layer.head_size)
        v = value[:t].view(t, layer.num_kv_heads, layer.head_size)
        layer.maybe_compute_kv_scales(k, v)
        layer.impl.write_kv(layer, k, v, attn_metadata)
    return torch.empty(0, dtype=key.dtype, device=key.device)


def unified_attention_with_output_impl(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> None:
    """Attention for the layer ``layer_name``, written into ``output``."""
    layer = _lookup(layer_name)
    attn_metadata = get_forward_context().attn_metadata
    if attn_metadata is not None:
        attn_metadata = metadata_for_layer(attn_metadata, layer)
    t = query.shape[0] if attn_metadata is None else attn_metadata.num_actual_tokens
    nh, nkv, hd = layer.num_heads, layer.num_kv_heads, layer.head_size
    out = output[:t].view(t, nh, hd)
    if attn_metadata is not None and t < output.shape[0]:
        output[t:].zero_()
    if layer.attn_type == ENCODER_ONLY:
        q, k, v = query[:t].view(t, nh, hd), key[:t].view(t, nkv, hd), value[:t].view(t, nkv, hd)
        encoder_only_attention(q, k, v, attn_metadata, layer.scale, out)
        return
    layer.impl.forward(
        layer,
        query[:t].view(t, nh, hd),
        key[:t].view(t, nkv, hd),
        value[:t].view(t, nkv, hd),
        attn_metadata,
        out,
    )


def _kv_cache_update_fake(key: torch.Tensor, value: torch.Tensor, layer_name: str) -> torch.Tensor:
    return torch.empty(0, dtype=key.dtype, device=key.device)


unified_kv_cache_update = register_op(
    "unified_kv_cache_update", unified_kv_cache_update_impl, _kv_cache_update_fake
)
"""``minivllm::unified_kv_cache_update``; it writes the layer's cache, which the graph
cannot see: the empty tensor it returns orders it before the attention op."""


def _attention_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> None:
    return None


unified_attention_with_output = register_op(
    "unified_attention_with_output",
    unified_attention_with_output_impl,
    _attention_fake,
    mutates_args=("output",),
)
"""``minivllm::unified_attention_with_output``: attention written into ``output``."""


def get_attention_layers(model: nn.Module) -> dict[str, Any]:
    """Attention layers of ``model`` by layer name, in construction order.

    This is what the forward context's ``no_compile_layers`` must contain when
    no `VllmConfig` was current at construction (the config's
    ``static_forward_context`` holds the same mapping otherwise).
    """
    return {m.layer_name: m for m in model.modules() if isinstance(m, Attention)}


def bind_kv_caches(
    layers: Mapping[str, Any],
    kv_caches: Sequence[torch.Tensor],
    layer_groups: Sequence[int] | None = None,
) -> None:
    """Give each attention layer its cache tensor (and KV cache group), in layer order."""
    if len(layers) != len(kv_caches):
        raise ValueError(f"{len(layers)} attention layers but {len(kv_caches)} KV cache tensors")
    groups = layer_groups if layer_groups is not None else [0] * len(layers)
    for layer, cache, group in zip(layers.values(), kv_caches, groups, strict=True):
        layer.kv_cache = cache
        layer.kv_group = group
