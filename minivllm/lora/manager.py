"""The adapters of one worker: host-side cache (LRU of ``max_cpu_loras``) and the
``max_loras`` slots of the LoRA layers, filled per step from the batch's requests."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from minivllm.logger import init_logger
from minivllm.lora.layers import LoRALinear, LoRARows, apply_lora
from minivllm.lora.peft import LoRAAdapter, load_adapter

if TYPE_CHECKING:
    from minivllm.config.lora import LoRAConfig
    from minivllm.config.vllm import VllmConfig
    from minivllm.lora.request import LoRARequest

logger = init_logger(__name__)


class LoRAManager:
    """Puts LoRA layers into a model and keeps the batch's adapters in their slots."""

    def __init__(
        self, model: nn.Module, lora_config: LoRAConfig, max_num_tokens: int, device: torch.device
    ) -> None:
        dtype = lora_config.lora_dtype
        assert isinstance(dtype, torch.dtype), "verify_with_model_config resolves it"
        self.config = lora_config
        self.dtype = dtype
        self.rows = LoRARows(lora_config.max_loras, max_num_tokens, dtype, device)
        self.layers: dict[str, LoRALinear] = apply_lora(
            model,
            lora_config.served_modules,
            self.rows,
            lora_config.max_lora_rank,
            dtype,
            lora_config.fully_sharded_loras,
        )
        self.cache: OrderedDict[LoRARequest, LoRAAdapter] = OrderedDict()
        """Loaded adapters, least recently used first (at most max_cpu_loras)."""
        self.slot_of: dict[LoRARequest, int] = {}
        """Adapter -> its slot (0-based) in the LoRA layers."""
        logger.info(
            "LoRA: %d layers, %d slots of rank %d (%s)",
            len(self.layers),
            lora_config.max_loras,
            lora_config.max_lora_rank,
            dtype,
        )

    def _adapter(self, request: LoRARequest) -> LoRAAdapter:
        adapter = self.cache.get(request)
        if adapter is None:
            adapter = load_adapter(request.lora_path, self.config.max_lora_rank, self.dtype)
            self.cache[request] = adapter
            max_cpu = self.config.max_cpu_loras or self.config.max_loras
            while len(self.cache) > max_cpu:
                evicted, _ = self.cache.popitem(last=False)
                logger.debug("LoRA %s dropped from the host cache", evicted.lora_name)
        self.cache.move_to_end(request)
        return adapter

    def _activate(self, requests: list[LoRARequest]) -> None:
        """Give each adapter of the batch a slot (evicting ones the batch does not use).

        ``requests`` is in the batch's order, not a set's: every tensor-parallel rank
        must give an adapter the same slot, and a set's order follows string hashes,
        which differ between processes."""
        assert len(requests) <= self.config.max_loras, "the scheduler caps adapters per batch"
        missing = [r for r in requests if r not in self.slot_of]
        if not missing:
            return
        for request in list(self.slot_of):
            if request not in requests and len(self.slot_of) + len(missing) > self.config.max_loras:
                del self.slot_of[request]
        in_use = set(self.slot_of.values())
        free = [s for s in range(self.config.max_loras) if s not in in_use]
        for request, slot in zip(missing, free, strict=False):
            adapter = self._adapter(request)
            for name, layer in self.layers.items():
                layer.set_slot(slot, adapter.weights.get(name, {}))
            self.slot_of[request] = slot

    def remove_adapters(self, lora_int_ids: Sequence[int]) -> None:
        """Drop these adapters from the host cache and their slots (the engine removed
        them; every rank gets the same ids with the same step)."""
        gone = set(lora_int_ids)
        for table in (self.cache, self.slot_of):
            for request in [r for r in table if r.lora_int_id in gone]:
                del table[request]

    def loaded_ids(self) -> list[int]:
        """Ids of the adapters loaded here (host cache or a slot), sorted."""
        return sorted({r.lora_int_id for r in [*self.cache, *self.slot_of]})

    def set_batch(
        self, lora_requests: Sequence[LoRARequest | None], num_tokens: Sequence[int]
    ) -> None:
        """The step's rows: request i has ``num_tokens[i]`` consecutive rows."""
        self._activate(list(dict.fromkeys(r for r in lora_requests if r is not None)))
        slot_ids: list[int] = []
        for request, count in zip(lora_requests, num_tokens, strict=True):
            slot = 0 if request is None else self.slot_of[request] + 1
            slot_ids.extend([slot] * count)
        self.rows.set_rows(slot_ids)


def make_lora_manager(
    model: nn.Module, vllm_config: VllmConfig, device: torch.device
) -> LoRAManager | None:
    """The model's LoRA layers and slots when LoRA is on (after the weights are loaded
    and packed: the LoRA layers wrap the final base layers)."""
    lora_config = vllm_config.lora_config
    if lora_config is None:
        return None
    max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens or 2048
    return LoRAManager(model, lora_config, max_num_tokens, device)
