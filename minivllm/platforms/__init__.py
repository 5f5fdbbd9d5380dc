"""Hardware platforms and the one that is current.

``current_platform`` is detected once at import (CUDA when torch sees a GPU,
otherwise CPU).  It is a proxy: code that imported it keeps working when a
test or ``minivllm config --platform`` swaps the platform with
``override_platform``, which is scoped to a ``with`` block.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from minivllm.platforms.cpu import CpuPlatform
from minivllm.platforms.cuda import CudaPlatform
from minivllm.platforms.interface import DeviceCapability, Platform, PlatformEnum


def _detect() -> Platform:
    try:
        import torch

        if torch.cuda.is_available():
            return CudaPlatform()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return CpuPlatform()


_detected: Platform | None = None
_override: contextvars.ContextVar[Platform | None] = contextvars.ContextVar(
    "minivllm_platform_override", default=None
)


def resolve_current_platform() -> Platform:
    """The platform in force: an active override, else the detected one."""
    global _detected
    override = _override.get()
    if override is not None:
        return override
    if _detected is None:
        _detected = _detect()
    return _detected


class _CurrentPlatform:
    """Forwards every attribute to `resolve_current_platform()`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(resolve_current_platform(), name)

    def __repr__(self) -> str:
        return repr(resolve_current_platform())


current_platform: Any = _CurrentPlatform()


@contextmanager
def override_platform(platform: Platform) -> Iterator[Platform]:
    """Resolve configurations as ``platform`` would inside the block."""
    token = _override.set(platform)
    try:
        yield platform
    finally:
        _override.reset(token)


def parse_platform(spec: str) -> Platform:
    """``"cpu"``, ``"cuda"`` (detected capability) or ``"cuda:9.0"`` -> a Platform."""
    text = spec.strip().lower()
    if text == "cpu":
        return CpuPlatform()
    if text == "cuda":
        return CudaPlatform()
    if text.startswith("cuda:"):
        try:
            major_s, minor_s = text[5:].split(".")
            return CudaPlatform(device_capability=(int(major_s), int(minor_s)))
        except ValueError:
            pass
    raise ValueError(
        f"invalid platform {spec!r}: use 'cpu', 'cuda', or 'cuda:MAJOR.MINOR' such as 'cuda:9.0'"
    )


__all__ = [
    "CpuPlatform",
    "CudaPlatform",
    "DeviceCapability",
    "Platform",
    "PlatformEnum",
    "current_platform",
    "override_platform",
    "parse_platform",
    "resolve_current_platform",
]
