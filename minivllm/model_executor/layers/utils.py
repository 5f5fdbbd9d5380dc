"""Helpers shared by the layers: parameter creation and weight loaders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

WeightLoader = Callable[..., None]


def make_param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    """An uninitialised inference parameter in ``dtype`` (default: torch's default dtype)."""
    data = torch.empty(*shape, dtype=dtype or torch.get_default_dtype())
    return nn.Parameter(data, requires_grad=False)


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    """Attach the function that copies a checkpoint tensor into ``param``."""
    param.weight_loader = loader  # type: ignore[attr-defined]


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor, *args: Any) -> None:
    """Copy a whole checkpoint tensor into ``param`` after checking the shape."""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(
            f"checkpoint tensor has shape {tuple(loaded.shape)} but the parameter expects "
            f"{tuple(param.shape)}; the checkpoint does not match the model config"
        )
    param.data.copy_(loaded)


def get_weight_loader(param: nn.Parameter) -> WeightLoader:
    """The parameter's own loader, or `default_weight_loader`."""
    return getattr(param, "weight_loader", default_weight_loader)
