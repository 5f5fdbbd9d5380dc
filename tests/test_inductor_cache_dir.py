"""Inductor's compiled kernels are kept under minivllm's cache root, not in /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm import envs

DERIVED = "MINIVLLM_DERIVED_INDUCTOR_CACHE_DIR"


def _inductor_dir_after_import(env: dict[str, str]) -> str:
    code = "import minivllm, os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_importing_minivllm_points_inductor_at_the_cache_root(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", DERIVED)}
    ours = str(tmp_path / "a" / "torchinductor")
    assert _inductor_dir_after_import({**base, "MINIVLLM_CACHE_ROOT": str(tmp_path / "a")}) == ours
    # A user's own choice is kept.
    mine = str(tmp_path / "mine")
    user = {**base, "MINIVLLM_CACHE_ROOT": str(tmp_path / "a"), "TORCHINDUCTOR_CACHE_DIR": mine}
    assert _inductor_dir_after_import(user) == mine


def test_a_child_with_another_cache_root_derives_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a parent that chose the directory passes on to a child process.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a" / "torchinductor"))
    monkeypatch.setenv(DERIVED, str(tmp_path / "a" / "torchinductor"))
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path / "b"))
    envs.set_default_inductor_cache_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "b" / "torchinductor")
