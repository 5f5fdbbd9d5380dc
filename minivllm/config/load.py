"""`LoadConfig`: how weights are read."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal

from minivllm.config.utils import config, hash_factors

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig

LoadFormat = Literal["auto", "gguf", "safetensors", "dummy"]


@config
class LoadConfig:
    """Configuration for loading the model weights."""

    load_format: LoadFormat = "auto"
    """"auto" picks from the model path ("gguf" for a GGUF file, "safetensors"
    for an HF directory); "dummy" fills weights with random values (for
    benchmarks and tests)."""
    download_dir: str | None = None
    """Where a hub download would go. minivllm never downloads: must be None."""
    safetensors_load_strategy: Literal["lazy", "eager"] = "lazy"
    """"lazy" memory-maps safetensors files; "eager" reads them fully first."""
    model_loader_extra_config: dict[str, Any] = field(default_factory=dict)
    """Extra options for the loader (none are defined yet; must be empty)."""
    device: str | None = None
    """Device weights are first loaded to. None: the model's device."""
    ignore_patterns: list[str] = field(default_factory=lambda: ["original/**/*"])
    """Glob patterns of checkpoint files to skip."""
    use_tqdm_on_load: bool = True
    """Show a progress bar while loading weights."""
    pt_load_map_location: str | dict[str, str] = "cpu"
    """``map_location`` for PyTorch checkpoints (kept for vLLM compatibility)."""

    def __post_init__(self) -> None:
        self.load_format = self.load_format.lower()  # type: ignore[assignment]
        self.check_supported()

    def check_supported(self) -> None:
        """Raise for settings that would need a hub or an unknown loader option."""
        if self.download_dir is not None:
            raise ValueError(
                f"download_dir={self.download_dir!r}: minivllm never downloads models; pass a "
                "local HF directory or GGUF file as the model and leave download_dir unset"
            )
        if self.model_loader_extra_config:
            raise ValueError(
                "model_loader_extra_config is not supported by minivllm (got keys "
                f"{sorted(self.model_loader_extra_config)}); leave it empty"
            )

    def resolve_load_format(self, model_config: ModelConfig) -> str:
        """The concrete format for ``model_config``: "gguf", "safetensors" or "dummy"."""
        natural = "gguf" if model_config.is_gguf else "safetensors"
        if self.load_format in ("auto", "dummy"):
            return natural if self.load_format == "auto" else "dummy"
        if self.load_format != natural:
            raise ValueError(
                f"load_format={self.load_format!r} does not match the model "
                f"{model_config.model!r}, which is read as {natural!r}; use load_format='auto'"
            )
        return natural

    def compute_hash(self) -> str:
        """How weights are read does not change the compiled graph: no factors."""
        return hash_factors([])
