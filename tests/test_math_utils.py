"""The integer helpers every layer shares (ceiling division, rounding up)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minivllm.math_utils import cdiv, round_up


@pytest.mark.parametrize(("a", "b"), [(0, 4), (1, 4), (4, 4), (5, 4), (17, 16), (1000, 7)])
def test_cdiv_and_round_up(a: int, b: int) -> None:
    pieces = cdiv(a, b)
    assert (pieces - 1) * b < a <= pieces * b or a == pieces == 0
    assert round_up(a, b) == pieces * b and round_up(a, b) % b == 0


def test_the_torch_free_core_imports_them_without_torch() -> None:
    code = (
        "import sys, minivllm.kv_cache.manager, minivllm.scheduler.scheduler;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
