"""Integer helpers.  Torch-free and importing nothing of minivllm, so every layer
(the scheduler and the KV cache manager too) can use them."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: how many ``b``-sized pieces hold ``a``."""
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return cdiv(value, multiple) * multiple


__all__ = ["cdiv", "round_up"]
