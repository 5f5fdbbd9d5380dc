"""`LoRARequest`: which adapter a request runs with (vLLM's import path and fields)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter by name, a unique positive integer id, and its PEFT directory."""

    lora_name: str
    """The adapter's name (what the server's ``model`` field selects)."""
    lora_int_id: int
    """A unique id > 0 per adapter; requests with the same id share the loaded weights."""
    lora_path: str = ""
    """Directory holding ``adapter_config.json`` and ``adapter_model.safetensors``."""
    base_model_name: str | None = field(default=None, compare=False)
    """The base model's served name (the server's ``/v1/models`` lists it as parent)."""

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be > 0, got {self.lora_int_id}.")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r} needs a lora_path.")

    @property
    def adapter_id(self) -> int:
        """vLLM's alias of ``lora_int_id``."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """vLLM's alias of ``lora_name``."""
        return self.lora_name

    @property
    def path(self) -> str:
        """vLLM's alias of ``lora_path``."""
        return self.lora_path
