"""A piece whose graph AOTAutograd cannot key (every piece of a graph loaded from an
AOT trace) is cached under a nonce from Python's ``random``.  The engine seeds
``random``, so the nonce used to repeat across processes and a piece was looked up
among another graph's entries (a ``KeyError`` from their guards, or another
graph's code).  Compiles now draw it from a fresh seed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import fx
from torch._functorch._aot_autograd import autograd_cache

from minivllm.compilation.compiler import PieceCompiler, unseeded_random


def test_unseeded_random_leaves_the_callers_draws_alone() -> None:
    random.seed(0)
    want = [random.random() for _ in range(3)]
    random.seed(0)
    got = [random.random()]
    with unseeded_random():
        inside = random.random()
    got += [random.random() for _ in range(2)]
    assert got == want and inside not in want
    random.seed(0)
    with unseeded_random():
        again = random.random()
    assert again != inside  # not the seeded sequence: a fresh one each time


def test_seeded_processes_compile_pieces_under_distinct_nonces(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    nonces: list[str] = []

    def nonce_key(*args: object, **kwargs: object) -> tuple[str, list[str]]:
        # What AOTAutograd does for a graph it cannot key, in the mode pieces use.
        assert torch._functorch.config.bypass_autograd_cache_key
        nonces.append(str(random.random()))
        return nonces[-1], []

    monkeypatch.setattr(autograd_cache, "autograd_cache_key", nonce_key)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 3.0 - 1.0)

    x = torch.randn(8)
    for _ in range(2):
        random.seed(0)  # each "process" seeds as the engine does
        fn = PieceCompiler(True, {}, None).compile(fx.symbolic_trace(f), [x], "size_8", False)
        out = fn(x)
        torch.testing.assert_close(out[0] if isinstance(out, tuple | list) else out, f(x))
    assert len(nonces) == 2 and nonces[0] != nonces[1]
