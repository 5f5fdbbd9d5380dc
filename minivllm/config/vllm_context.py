"""The configuration in force while a model is built or run.

Custom ops and layers ask for "the current config" while they are constructed, so
that the model code does not have to thread it through every constructor.  The
config lives in a `contextvars.ContextVar`: it is scoped to a ``with`` block, and
threads or asyncio tasks each see their own.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

T = TypeVar("T")

_current_vllm_config: contextvars.ContextVar[VllmConfig | None] = contextvars.ContextVar(
    "minivllm_current_vllm_config", default=None
)
_current_prefix: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "minivllm_current_model_prefix", default=None
)


@contextmanager
def set_current_vllm_config(
    vllm_config: VllmConfig, prefix: str | None = None
) -> Iterator[VllmConfig]:
    """Make ``vllm_config`` the current config inside the block (model construction).

    ``prefix`` names the model being built (e.g. a draft model).
    """
    config_token = _current_vllm_config.set(vllm_config)
    prefix_token = _current_prefix.set(prefix)
    try:
        yield vllm_config
    finally:
        _current_prefix.reset(prefix_token)
        _current_vllm_config.reset(config_token)


def get_current_vllm_config() -> VllmConfig:
    """The current config; a default `VllmConfig` (with a warning) when none is set."""
    vllm_config = _current_vllm_config.get()
    if vllm_config is not None:
        return vllm_config
    # Outside model construction (unit tests of single layers, mostly) a default
    # config keeps the layer usable; the warning says the defaults were assumed.
    logger.warning("Current minivllm config is not set; using a default VllmConfig.")
    from minivllm.config.vllm import VllmConfig

    return VllmConfig()


def get_current_vllm_config_or_none() -> VllmConfig | None:
    """The current config, or None when no ``set_current_vllm_config`` block is active."""
    return _current_vllm_config.get()


def get_current_model_prefix() -> str | None:
    """The ``prefix`` given to the active ``set_current_vllm_config`` block."""
    return _current_prefix.get()


def get_cached_compilation_config() -> CompilationConfig:
    """The current config's `CompilationConfig` (hot path for custom-op dispatch).

    Reading a context variable is already cheap, so nothing is cached beyond the
    config itself; a default is built (with a warning) when no config is set.
    """
    vllm_config = _current_vllm_config.get()
    if vllm_config is None:
        vllm_config = get_current_vllm_config()
    return vllm_config.compilation_config


def get_layers_from_vllm_config(
    vllm_config: VllmConfig, layer_type: type[T], layer_names: Iterable[str] | None = None
) -> dict[str, T]:
    """Layers of type ``layer_type`` registered in the static forward context.

    ``layer_names`` restricts the lookup; names that are missing or of another type
    are left out.
    """
    forward_context: dict[str, Any] = vllm_config.compilation_config.static_forward_context
    names = forward_context.keys() if layer_names is None else layer_names
    return {
        name: layer for name in names if isinstance(layer := forward_context.get(name), layer_type)
    }


__all__ = [
    "get_cached_compilation_config",
    "get_current_model_prefix",
    "get_current_vllm_config",
    "get_current_vllm_config_or_none",
    "get_layers_from_vllm_config",
    "set_current_vllm_config",
]
