"""Helpers shared by the model files: dtype scope, names, checkpoint loading."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from minivllm.logger import init_logger
from minivllm.model_executor.layers.utils import get_weight_loader

logger = init_logger(__name__)

StackedMapping = list[tuple[str, str, str | int]]
"""(our stacked param fragment, checkpoint fragment, shard id) triples."""

LLAMA_STACKED_PARAMS: StackedMapping = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]
"""HF Llama-family projections that our layers hold stacked in one matrix."""


@contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters in ``dtype`` inside the block, restoring the old default after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def maybe_prefix(prefix: str, name: str) -> str:
    """``prefix.name``, or just ``name`` at the top level."""
    return f"{prefix}.{name}" if prefix else name


def load_weights_stacked(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: StackedMapping,
    *,
    skip_prefixes: tuple[str, ...] = (),
    optional_params: tuple[str, ...] = (),
) -> set[str]:
    """Copy checkpoint tensors (HF names) into ``model``'s parameters.

    Names matching a ``stacked`` fragment go into the stacked parameter through its
    shard-aware weight loader.  Checkpoint names starting with ``skip_prefixes``
    and unknown names are ignored (the latter logged).  Raises ValueError when a
    parameter other than ``optional_params`` received nothing.
    """
    params = dict(model.named_parameters(remove_duplicate=True))
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in weights:
        if name.startswith(skip_prefixes) or "rotary_emb.inv_freq" in name:
            continue
        for whole, part, shard_id in stacked:
            if part not in name:
                continue
            target = name.replace(part, whole)
            if target not in params:
                continue
            param = params[target]
            get_weight_loader(param)(param, tensor, shard_id)
            loaded.add(target)
            break
        else:
            if name not in params:
                unexpected.append(name)
                continue
            param = params[name]
            get_weight_loader(param)(param, tensor)
            loaded.add(name)
    if unexpected:
        logger.warning("ignored %d checkpoint tensors, e.g. %s", len(unexpected), unexpected[:3])
    missing = sorted(set(params) - loaded - set(optional_params))
    if missing:
        raise ValueError(
            f"checkpoint is missing {len(missing)} weights, e.g. {missing[:5]}; "
            "is it the right model for this config?"
        )
    return loaded
