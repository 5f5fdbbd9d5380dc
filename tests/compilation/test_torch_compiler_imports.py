"""torch.compile's modules are imported without Triton on a process with no GPU
(`minivllm.kernels.torch_compiler`): Triton's compiler library would stay mapped,
~66 MiB resident, in every CPU engine for code it never runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch

    import minivllm.compilation  # what the worker imports before compiling anything

    compiled = torch.compile(lambda x: (x * 2).sin() + 1, backend="inductor", fullgraph=True)
    x = torch.randn(64)
    # Inductor's vectorised sin differs from ATen's in the last bit or so; near 0,
    # allclose's default atol (1e-8) is tighter than one float32 step of 1.0.
    ok = torch.allclose(compiled(x), (x * 2).sin() + 1, atol=1e-6)
    maps = open("/proc/self/maps").read()
    report = {
        "compiled": ok,
        "inductor": "torch._inductor.compile_fx" in sys.modules,
        "triton_module": "triton" in sys.modules,
        "triton_mapped": "libtriton" in maps,
    }
    try:
        import triton  # noqa: F401  # code that wants it still gets it

        report["importable"] = True
    except ImportError:
        report["importable"] = False
    print("REPORT " + json.dumps(report))
    """
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU Triton is kept")
def test_compiling_on_a_cpu_never_loads_triton(tmp_path: Path) -> None:
    triton_installed = (
        subprocess.run([sys.executable, "-c", "import triton"], capture_output=True).returncode == 0
    )
    env_cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env_cache},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    assert report["compiled"] and report["inductor"]
    assert not report["triton_module"] and not report["triton_mapped"]
    assert report["importable"] == triton_installed
