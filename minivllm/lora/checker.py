"""The engine's check of a request's adapter, before it is queued: LoRA on, the PEFT
config supported, the rank within ``max_lora_rank``, every tensor the base's shape."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from minivllm.lora.peft import PeftConfig, check_adapter, slice_shapes_of

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig
    from minivllm.lora.request import LoRARequest


class AdapterChecker:
    """Checks adapters against one engine's model (each adapter read once)."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.lora_config = vllm_config.lora_config
        model_config = vllm_config.model_config
        assert model_config is not None
        self.hf_config = model_config.hf_text_config
        self._checked: dict[LoRARequest, PeftConfig] = {}
        self._removed: deque[int] = deque()
        """Ids removed since the last step (the server's thread appends, the engine's
        thread takes them for the workers)."""

    def check(self, lora_request: LoRARequest) -> PeftConfig:
        """The adapter's config; ValueError saying what is wrong and how to fix it."""
        if self.lora_config is None:
            raise ValueError(
                f"request asks for LoRA adapter {lora_request.lora_name!r}, but LoRA is off; "
                "start the engine with enable_lora=True (--enable-lora)."
            )
        known = self._checked.get(lora_request)
        if known is None:
            known = check_adapter(
                lora_request.lora_path,
                self.lora_config.max_lora_rank,
                slice_shapes_of(self.hf_config),
            )
            self._checked[lora_request] = known
        return known

    def forget(self, lora_int_id: int) -> bool:
        """Drop the checks of the adapter with this id; False when none was known."""
        gone = [r for r in list(self._checked) if r.lora_int_id == lora_int_id]
        for request in gone:
            del self._checked[request]
        self._removed.append(lora_int_id)
        return bool(gone)

    def take_removed(self) -> list[int]:
        """The ids removed since the last call, for the next step's `SchedulerOutput`
        (every rank drops those adapters' weights with the same step)."""
        taken = []
        while self._removed:
            taken.append(self._removed.popleft())
        return taken
