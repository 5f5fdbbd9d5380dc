"""Which slot an adapter gets depends only on the batch, never on the process.

Every tensor-parallel rank fills its own slots from the same step, so two ranks
must agree: the adapters new to a batch take the free slots in the order they first
appear in it.  (A set's order would follow the adapters' string hashes, which
differ between processes, and ranks would then mix adapters up.)"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from minivllm.config.lora import LoRAConfig
from minivllm.lora.manager import LoRAManager
from minivllm.lora.request import LoRARequest

NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]


def manager(max_loras: int) -> LoRAManager:
    config = LoRAConfig(max_loras=max_loras, lora_dtype=torch.float32)
    lora_manager = LoRAManager(nn.Module(), config, 16, torch.device("cpu"))
    empty = types.SimpleNamespace(weights={})
    lora_manager._adapter = lambda request: empty  # no files: slots only
    return lora_manager


@pytest.mark.parametrize("reverse", [False, True])
def test_new_adapters_take_free_slots_in_batch_order(reverse: bool) -> None:
    requests = [LoRARequest(name, i + 1, f"/adapters/{name}") for i, name in enumerate(NAMES)]
    if reverse:
        requests.reverse()
    lora_manager = manager(max_loras=len(requests))
    batch = [None, *requests, requests[0], None]
    lora_manager.set_batch(batch, [1] * len(batch))
    assert [lora_manager.slot_of[r] for r in requests] == list(range(len(requests)))
    # Row i uses slot_of + 1 (0: no adapter), as the one-hot mask shows.
    mask = lora_manager.rows.mask[: len(batch)]
    assert mask[0].sum() == 0 and mask[-1].sum() == 0
    assert mask[1:-1].argmax(dim=1).tolist() == [*range(len(requests)), 0]


def test_an_evicted_slot_goes_to_the_next_new_adapter_in_batch_order() -> None:
    a, b, c, d = (LoRARequest(n, i + 1, f"/adapters/{n}") for i, n in enumerate(NAMES[:4]))
    lora_manager = manager(max_loras=2)
    lora_manager.set_batch([a, b], [1, 1])
    lora_manager.set_batch([d, c], [1, 1])
    assert lora_manager.slot_of == {d: 0, c: 1}
