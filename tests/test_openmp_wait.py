"""Importing minivllm sets a short OpenMP spin unless the user chose a wait policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import minivllm, os; "
    "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, "1000 None"),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE"),
        ({"GOMP_SPINCOUNT": "300000"}, "300000 None"),
    ],
)
def test_wait_policy_default_and_user_values(user: dict[str, str], expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(user)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[0] == expected
