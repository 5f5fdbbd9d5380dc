"""The Triton paged-attention kernels, run by Triton's CPU interpreter.

CI has no GPU, so the kernels of `minivllm.attention.backends.triton_paged` would
otherwise never run there.  ``TRITON_INTERPRET=1`` executes the same kernel source
with numpy on CPU tensors: what it checks is the kernels' indexing and arithmetic
(request lookup, causal lengths, block tables, online softmax, padding), not their
speed or their GPU compilation (tests/gpu does that on a CUDA machine).  The kernel
module must be imported with the variable set, so the cases run in a subprocess (one
for all three: each would otherwise pay ~2 s of imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="triton comes with the test extras")

SCRIPT = textwrap.dedent(
    """
    import json
    import traceback

    import torch
    from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
    from minivllm.attention.backends.triton_paged import TritonPagedBackend
    from minivllm.attention.paged_kv import build_attention_metadata


    def check(head_dim, graph, window):
        nh, nkv, hd, bs = 8, 2, head_dim, 16

        class Layer:
            sliding_window = window
            scale = hd**-0.5
            k_scale = torch.tensor(1.0)
            v_scale = torch.tensor(1.0)

        # Two prefills (one of them a later chunk) around two decodes, padded to 32 rows.
        q_lens, s_lens = [5, 1, 1, 17], [5, 30, 7, 40]
        tables = [[3], [0, 1], [2], [4, 5, 6]]
        attn_metadata = build_attention_metadata(q_lens, s_lens, tables, bs, num_padded_tokens=32)
        t = attn_metadata.num_actual_tokens
        torch.manual_seed(0)
        cache0 = torch.randn(2, 8, bs, nkv, hd)
        q, k, v = torch.randn(32, nh, hd), torch.randn(32, nkv, hd), torch.randn(32, nkv, hd)
        triton_metadata = attn_metadata
        if graph:
            # As a FULL CUDA graph sees it: the metadata copied into the backend's
            # persistent buffers (sized for more requests and blocks than this step has).
            buffers = TritonPagedBackend.make_graph_buffers(8, 6, 64, torch.device("cpu"))
            buffers.fill(attn_metadata, 32)
            triton_metadata = buffers.metadata(32)
        outs = []
        for backend, rows, step_metadata in (
            (CpuSdpaBackend(), t, attn_metadata), (TritonPagedBackend(), 32, triton_metadata)
        ):
            layer = Layer()
            layer.kv_cache = cache0.clone()
            backend.write_kv(layer, k[:rows], v[:rows], step_metadata)
            out = torch.zeros(rows, nh, hd)
            backend.forward(layer, q[:rows], k[:rows], v[:rows], step_metadata, out)
            outs.append((out, layer.kv_cache))
        (ref, ref_cache), (got, got_cache) = outs
        # Padding rows (slot -1) write nothing, so the caches agree exactly.
        torch.testing.assert_close(got_cache, ref_cache, rtol=0, atol=0)
        torch.testing.assert_close(got[:t], ref, atol=2e-5, rtol=2e-5)
        assert got[t:].abs().max() == 0, "padding rows attend to nothing"


    results = {{}}
    for case in {cases!r}:
        try:
            check(*case)
            results[repr(case)] = "ok"
        except Exception:
            results[repr(case)] = traceback.format_exc()
    print(json.dumps(results))
    """
)

CASES = [(64, False, None), (48, False, 20), (64, True, None)]
"""(head_dim, graph, window).  48: not a power of two; graph: via buffers; window 20: a
sliding-window layer (the 17-token chunk of a 40-token context spans blocks the window
leaves out)."""


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    """Each case's outcome ("ok", or its traceback), from one interpreted subprocess."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(cases=[tuple(c) for c in CASES])],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("head_dim", "graph", "window"), CASES)
def test_triton_kernels_match_sdpa_backend(
    results: dict[str, str], head_dim: int, graph: bool, window: int | None
) -> None:
    assert results[repr((head_dim, graph, window))] == "ok"
