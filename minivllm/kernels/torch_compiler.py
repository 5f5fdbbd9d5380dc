"""torch.compile's own modules (Dynamo and Inductor), imported without Triton where
no GPU can use it.

Importing Dynamo probes for the Triton package and Inductor imports it outright when
it is installed (it is, beside xgrammar).  On a process without a GPU, Inductor
generates C++ and never runs Triton, yet loading Triton maps its ~400 MB compiler
library: ~66 MiB of it resident for the life of the process (a large share of what a
small model's engine holds beyond its weights) and ~0.2 s of every start.

`import_torch_compiler` imports Dynamo and Inductor with Triton hidden from those
imports where no CUDA device is visible, and records Triton as absent in torch's
cached probes (which is what Inductor decides by on a CPU) and in the one lookup
Inductor's graph cache makes when it saves a graph.  The package stays
importable afterwards: code that imports Triton itself (the CUDA attention kernels,
run under Triton's interpreter in tests) still gets it.  Where a GPU is visible, or
Triton or Inductor was imported earlier, nothing changes.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()


def import_torch_compiler() -> bool:
    """Import Dynamo and Inductor (idempotent); returns whether Triton was kept out."""
    with _lock:
        if "torch._inductor.compile_fx" in sys.modules:
            return "triton" not in sys.modules
        import torch

        if "triton" in sys.modules or "torch._dynamo" in sys.modules or _gpu_visible(torch):
            _import_compiler()
            return "triton" not in sys.modules
        sys.modules["triton"] = None  # type: ignore[assignment]  # import raises ImportError
        try:
            _import_compiler()
            from torch.utils import _triton

            # Both probes are cached: they answer "absent" for the rest of the process.
            _triton.has_triton_package()
            _triton.get_triton_version((0, 0))
            # Inductor's graph cache asks for Triton's GPU backend on every save (for a
            # cache key that only GPU graphs use, and takes a failure as "none").
            if hasattr(_triton, "triton_backend"):
                _triton.triton_backend = _no_triton_backend
        finally:
            if "triton" in sys.modules and sys.modules["triton"] is None:
                del sys.modules["triton"]
        return True


def _no_triton_backend() -> None:
    raise ImportError("Triton is kept out of this process: it has no GPU")


def _gpu_visible(torch) -> bool:  # noqa: ANN001
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - a broken driver: keep torch's own behaviour
        return True


def _import_compiler() -> None:
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor.codegen.common import init_backend_registration

    # Once per process (cached): imports every device's code generators, some of
    # which import Triton when it is there.
    init_backend_registration()
