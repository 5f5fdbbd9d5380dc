"""The CPU kernels build wherever a C++ compiler is on PATH.

Every kernel test skips where `lowbit_cpu.available()` is false ("no C++ compiler
here"), so a source that stops compiling would otherwise turn those tests into skips
and pass the suite; this test fails instead."""

from __future__ import annotations

import shutil

import pytest

from minivllm import envs
from minivllm.kernels import lowbit_cpu


def test_kernels_build_where_a_compiler_is_present() -> None:
    compiler = envs.cxx_compiler() or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH: the kernels' tests skip too")
    if not envs.cpu_kernels():
        pytest.skip("MINIVLLM_CPU_KERNELS=0 turns the kernels off")
    assert lowbit_cpu.available(), "a C++ compiler is here but minivllm's CPU kernels did not build"
