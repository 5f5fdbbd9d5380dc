"""Integers with size suffixes, as vLLM's flags take them (``8k``, ``8K``, ``auto``)."""

from __future__ import annotations

import argparse
import re
from decimal import Decimal

SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
"""A number with a size suffix: ``8k``, ``1.5m``, ``2G``."""
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """An integer, optionally with a size suffix, as vLLM takes it.

    Lower-case suffixes are decimal and take decimals (``1k`` = 1000,
    ``25.6k`` = 25600, ``1m`` = 10**6); upper-case ones are binary and take whole
    numbers only (``1K`` = 1024, ``1M`` = 2**20); ``g``/``G`` and ``t``/``T`` too.
    """
    value = text.strip()
    match = SUFFIXED.fullmatch(value)
    if match is None:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid integer {text!r}; use e.g. 2048, 8k (8000) or 8K (8192)"
            ) from None
    number, suffix = match.groups()
    if suffix in _DECIMAL_SUFFIXES:
        return int(Decimal(number) * _DECIMAL_SUFFIXES[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"invalid integer {text!r}: binary suffixes such as {suffix} take whole numbers; "
            f"did you mean {number}{suffix.lower()}?"
        )
    return int(number) * _BINARY_SUFFIXES[suffix]


def human_readable_int_or_auto(text: str) -> int:
    """`human_readable_int`, or -1 ("the model's own limit") for ``auto`` or ``-1``."""
    if text.strip().lower() in ("auto", "-1"):
        return -1
    return human_readable_int(text)


HUMAN_READABLE_HELP = (
    " Accepts size suffixes: 1k = 1000, 1m = 10^6 (decimals allowed, e.g. 25.6k), "
    "1K = 1024, 1M = 2^20."
)
"""Appended to the help of flags parsed with `human_readable_int`."""


__all__ = ["HUMAN_READABLE_HELP", "SUFFIXED", "human_readable_int", "human_readable_int_or_auto"]
