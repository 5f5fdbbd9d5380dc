"""Rotary position embedding (neox / rotate-half layout, as HF Llama and Qwen use)."""

from __future__ import annotations

import math
from typing import Any

import torch

from minivllm.model_executor.custom_op import CustomOp

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters_from_config(hf_config: Any) -> dict[str, Any]:
    """The rope settings of a transformers config as one dict with ``rope_theta``.

    transformers 5 keeps them in ``rope_parameters``; older configs use
    ``rope_theta`` plus an optional ``rope_scaling`` dict.  Hence getattr: which of
    these a transformers (or GGUF-derived) config carries depends on its version.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling and not params.get("rope_type"):
        params.update(scaling)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _inv_freq(rotary_dim: int, params: dict[str, Any]) -> torch.Tensor:
    base = float(params["rope_theta"])
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend between.
        factor = float(params["factor"])
        low_ff = float(params["low_freq_factor"])
        high_ff = float(params["high_freq_factor"])
        old_ctx = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low_ff, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high_ff) & (wavelen <= old_ctx / low_ff)
        return torch.where(medium, blended, scaled)
    raise ValueError(
        f"rope_type {rope_type!r} is not supported; supported: {', '.join(_SUPPORTED_ROPE_TYPES)}"
    )


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Applies rotary embeddings to flat ``q [T, nh*hd]`` and ``k [T, nkv*hd]``.

    The native path computes cos/sin from the positions each call; the optimized
    path indexes a cos/sin table precomputed up to ``max_position``.
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position: int,
        rope_parameters: dict[str, Any],
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        inv_freq = _inv_freq(rotary_dim, rope_parameters)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # Kept as a float32 buffer; cast at use so a bf16 model keeps full-precision angles.
        self.register_buffer(
            "cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False
        )

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        x = x.view(t, -1, self.head_size)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        cos = cos.to(x.dtype)[:, None, :]
        sin = sin.to(x.dtype)[:, None, :]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        if rest.shape[-1]:
            out = torch.cat([out, rest], dim=-1)
        return out.reshape(t, -1)

    def forward_native(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq.float()[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_optimized(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_sin = self.cos_sin_cache.index_select(0, positions)
        cos, sin = cos_sin.chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position={self.max_position}, {super().extra_repr()}"
        )


def get_rope(
    head_size: int, rotary_dim: int, max_position: int, rope_parameters: dict[str, Any]
) -> RotaryEmbedding:
    """Build the rotary embedding for the given settings (see `rope_parameters_from_config`)."""
    return RotaryEmbedding(head_size, rotary_dim, max_position, rope_parameters)
