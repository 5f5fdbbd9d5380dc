"""Rotary position embedding (neox / rotate-half layout, as HF Llama and Qwen use)."""

from __future__ import annotations

import math
from typing import Any

import torch

from minivllm.config.vllm import get_current_vllm_config_or_none
from minivllm.model_executor.custom_op import CustomOp

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


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


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(
    rotary_dim: int, inv_freq: torch.Tensor, params: dict[str, Any], max_position: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies by ``factor``, keep the high ones, ramp
    linearly between the dimensions that turn ``beta_fast`` and ``beta_slow`` times
    over the original context; cos/sin are scaled by the attention factor."""
    base = float(params["rope_theta"])
    factor = float(params["factor"])
    original = float(params.get("original_max_position_embeddings") or max_position)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(num_rotations: float) -> float:
        return (
            rotary_dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    blended = (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate
    return blended, float(attention_factor)


def _inv_freq(
    rotary_dim: int, params: dict[str, Any], max_position: int = 2048
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of the rope type, and the factor cos/sin are scaled by."""
    base = float(params["rope_theta"])
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if rope_type == "yarn":
        return _yarn(rotary_dim, inv_freq, params, max_position)
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
        return torch.where(medium, blended, scaled), 1.0
    raise ValueError(
        f"rope_type {rope_type!r} is not supported; supported: {', '.join(_SUPPORTED_ROPE_TYPES)}"
    )


def table_rows(max_position: int) -> int:
    """Positions the cos/sin table covers: the engine's ``max_model_len`` when a model
    is built for one (no position reaches it; Gemma 3 270M's two tables at 32k
    positions are 64 MiB, a quarter of its file, where 1k positions need 2 MiB),
    else the model's ``max_position``."""
    cfg = get_current_vllm_config_or_none()
    model_config = None if cfg is None else cfg.model_config
    max_len = None if model_config is None else model_config.max_model_len
    return max_len or max_position


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Applies rotary embeddings to flat ``q [T, nh*hd]`` and ``k [T, nkv*hd]``.

    The native path computes cos/sin from the positions each call; the optimized
    path indexes a cos/sin table precomputed up to `table_rows`.
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
        inv_freq, self.mscale = _inv_freq(rotary_dim, rope_parameters, max_position)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        rows = table_rows(max_position)
        freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # Kept as a float32 buffer; cast at use so a bf16 model keeps full-precision angles.
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        if self.mscale != 1.0:
            cos_sin = cos_sin * self.mscale
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

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
        if self.mscale != 1.0:
            cos, sin = cos * self.mscale, sin * self.mscale
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
