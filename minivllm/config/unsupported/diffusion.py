"""`DiffusionConfig`: diffusion LLMs (dLLM). Not supported by minivllm."""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors


@config
class DiffusionConfig(UnsupportedFeature):
    """Configuration for diffusion language models."""

    FEATURE: ClassVar[str] = "diffusion LLMs (diffusion_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    canvas_length: int | None = None
    """Tokens denoised together per step (the canvas)."""
    num_denoising_steps: int | None = None
    """Denoising iterations per canvas."""

    def compute_hash(self) -> str:
        return hash_factors(get_hash_factors(self, set()))
