"""Paged attention over the KV cache equals dense causal attention."""

from __future__ import annotations

import gc
import random

import pytest
import torch
import torch.nn.functional as F

from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.layer import Attention
from minivllm.attention.paged_kv import (
    allocate_kv_caches,
    build_attention_metadata,
    kv_cache_bytes_per_block,
    resolve_kv_cache_dtype,
)

NH, NKV, HD = 4, 2, 16


def dense_reference(q, k, v):
    """Causal attention of one full sequence: q [L, NH, HD], k/v [L, NKV, HD]."""
    rep = NH // NKV
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(rep, 1).transpose(0, 1),
        v.repeat_interleave(rep, 1).transpose(0, 1),
        is_causal=True,
        scale=HD**-0.5,
    )
    return out.transpose(0, 1).reshape(q.shape[0], NH * HD)


def make_layer(kv_dtype=torch.float32, num_blocks=128, block_size=16, **kwargs):
    layer = Attention(NH, HD, HD**-0.5, NKV, prefix="l0.attn", **kwargs)
    layer.kv_cache = allocate_kv_caches(1, num_blocks, block_size, NKV, HD, kv_dtype)[0]
    return layer


def run_schedule(layer, block_size, seqs, chunks, seed=0, padded=0):
    """Feed each sequence in the given chunk sizes, one flat batch per step.

    ``chunks[i]`` lists the query lengths of sequence i per step (0 = idle).
    Returns the concatenated outputs per sequence in position order.
    """
    q_all, k_all, v_all = seqs
    free = list(range(layer.kv_cache.shape[1]))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(-(-q.shape[0] // block_size))] for q in q_all]
    done = [0] * len(q_all)
    outs = [[] for _ in q_all]
    for step in range(max(len(c) for c in chunks)):
        reqs = [i for i, c in enumerate(chunks) if step < len(c) and c[step] > 0]
        q_lens = [chunks[i][step] for i in reqs]
        s_lens = [done[i] + chunks[i][step] for i in reqs]
        parts = [(q_all[i][done[i] : s], k_all[i][done[i] : s], v_all[i][done[i] : s])
                 for i, s in zip(reqs, s_lens, strict=True)]  # fmt: skip
        n = sum(q_lens)
        attn_metadata = build_attention_metadata(
            q_lens, s_lens, [tables[i] for i in reqs], block_size, num_padded_tokens=n + padded
        )
        q, k, v = (torch.cat([p[j] for p in parts]).flatten(1) for j in range(3))
        pad = lambda x: torch.cat([x, torch.randn(padded, x.shape[1])])  # noqa: E731
        with set_forward_context(attn_metadata, {layer.layer_name: layer}):
            out = layer(pad(q), pad(k), pad(v))
        assert out.shape == (n + padded, NH * HD)
        assert torch.all(out[n:] == 0)
        start = 0
        for i, ql in zip(reqs, q_lens, strict=True):
            outs[i].append(out[start : start + ql])
            start += ql
            done[i] += ql
    return [torch.cat(o) for o in outs]


def random_seqs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple([torch.randn(n, h, HD, generator=g) for n in lengths] for h in (NH, NKV, NKV))


@pytest.mark.parametrize("block_size", [1, 16])
def test_mixed_prefill_decode_matches_dense(block_size):
    lengths = [23, 5, 17, 9]
    seqs = random_seqs(lengths)
    # Step 0: prefill chunks; later steps mix chunked prefill and decode.
    chunks = [
        [10, 7, 1, 1, 1, 1, 1, 1],
        [0, 3, 1, 1],
        [17],
        [4, 1, 1, 1, 1, 1],
    ]
    assert [sum(c) for c in chunks] == lengths
    layer = make_layer(block_size=block_size)
    outs = run_schedule(layer, block_size, seqs, chunks, padded=3)
    for i in range(len(lengths)):
        ref = dense_reference(seqs[0][i], seqs[1][i], seqs[2][i])
        torch.testing.assert_close(outs[i], ref, atol=1e-5, rtol=1e-5)


def test_decode_rows_split_by_a_prefill_match_dense():
    """Decode requests whose query rows are not 0..n-1 (a prefill chunk sits between)."""
    lengths = [12, 20, 9, 15]
    seqs = random_seqs(lengths, seed=3)
    # Step 1: seq 0 decodes, seq 1 prefills 8 tokens, seqs 2 and 3 decode.
    chunks = [[11, 1], [12, 8], [8, 1], [14, 1]]
    layer = make_layer(block_size=4)
    outs = run_schedule(layer, 4, seqs, chunks, padded=2)
    for i in range(len(lengths)):
        ref = dense_reference(seqs[0][i], seqs[1][i], seqs[2][i])
        torch.testing.assert_close(outs[i], ref, atol=1e-5, rtol=1e-5)


def test_step_plan_is_built_once_per_step(monkeypatch):
    """Every layer of a step reuses the first layer's plan; a new step builds its own."""
    from minivllm.attention.backends import cpu_sdpa

    calls = []
    real = cpu_sdpa.build_step_plan
    monkeypatch.setattr(
        cpu_sdpa,
        "build_step_plan",
        lambda attn_metadata, bs, w=None: calls.append(attn_metadata) or real(attn_metadata, bs, w),
    )
    layers = [make_layer(block_size=4), make_layer(block_size=4)]
    layers[1].layer_name = "l1.attn"
    q, k, v = random_seqs([6, 6], seed=4)
    for step in range(2):
        attn_metadata = build_attention_metadata([3, 3], [3 * step + 3] * 2, [[0, 1], [2, 3]], 4)
        ctx = {layer.layer_name: layer for layer in layers}
        rows = slice(3 * step, 3 * step + 3)
        flat = [torch.cat([x[0][rows], x[1][rows]]).flatten(1) for x in (q, k, v)]
        with set_forward_context(attn_metadata, ctx):
            for layer in layers:
                layer(*flat)
        assert len(calls) == step + 1 and calls[-1] is attn_metadata


def test_pure_decode_batch_matches_dense():
    lengths = [3, 40, 1, 18, 33]
    seqs = random_seqs(lengths, seed=1)
    chunks = [[n - 1, 1] if n > 1 else [0, 1] for n in lengths]
    layer = make_layer(block_size=4)
    outs = run_schedule(layer, 4, seqs, chunks)
    for i in range(len(lengths)):
        ref = dense_reference(seqs[0][i], seqs[1][i], seqs[2][i])
        torch.testing.assert_close(outs[i], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("calculate", [False, True])
def test_fp8_cache_within_tolerance(cache_dtype, calculate):
    dtype = resolve_kv_cache_dtype(cache_dtype, torch.float32)
    lengths = [12, 7]
    seqs = random_seqs(lengths, seed=2)
    layer = make_layer(
        dtype, block_size=16, kv_cache_dtype=cache_dtype, calculate_kv_scales=calculate
    )
    outs = run_schedule(layer, 16, seqs, [[8, 1, 1, 1, 1], [7]])
    assert layer.kv_cache.dtype == dtype
    if calculate:
        # Scale from the first batch: its largest |k| maps to the fp8 maximum.
        first_k = torch.cat([seqs[1][0][:8], seqs[1][1]])
        expected = first_k.abs().max() / torch.finfo(dtype).max
        torch.testing.assert_close(layer.k_scale, expected)
    else:
        assert float(layer.k_scale) == 1.0
    # e4m3 keeps 3 mantissa bits, e5m2 only 2: relative error of a few percent.
    tol = 0.05 if cache_dtype == "fp8" else 0.1
    for i in range(2):
        ref = dense_reference(seqs[0][i], seqs[1][i], seqs[2][i])
        assert (outs[i] - ref).norm() / ref.norm() < tol


def test_no_metadata_runs_causal_without_cache():
    layer = make_layer()
    q, k, v = (x[0] for x in random_seqs([6]))
    with set_forward_context(None, {layer.layer_name: layer}):
        out = layer(q.flatten(1), k.flatten(1), v.flatten(1))
    torch.testing.assert_close(out, dense_reference(q, k, v), atol=1e-5, rtol=1e-5)
    assert torch.all(layer.kv_cache == 0)


def test_custom_ops_trace_with_fake_tensors():
    layer = make_layer(block_size=4)
    attn_metadata = build_attention_metadata([5], [5], [[2, 0]], 4)
    q, k, v = (x[0].flatten(1) for x in random_seqs([5]))

    def fn(q, k, v):
        out = torch.empty_like(q)
        dep = torch.ops.minivllm.unified_kv_cache_update(k, v, "l0.attn")
        torch.ops.minivllm.unified_attention_with_output(q, k, v, out, "l0.attn", dep)
        return out

    with set_forward_context(attn_metadata, {layer.layer_name: layer}):
        compiled = torch.compile(fn, backend="eager", fullgraph=True)
        got = compiled(q, k, v)
    ref = dense_reference(*(x[0] for x in random_seqs([5])))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert layer.kv_cache[1, 0].abs().sum() > 0  # the cache was written through the op


def test_cache_dtype_and_size_helpers():
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.float32) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2
    with pytest.raises(ValueError, match="fp8_inc"):
        resolve_kv_cache_dtype("fp8_inc", torch.float32)
    assert (
        kv_cache_bytes_per_block(16, 3, 64, torch.bfloat16, num_layers=30)
        == 2 * 16 * 3 * 64 * 2 * 30
    )
    caches = allocate_kv_caches(2, 5, 16, 3, 64, torch.float8_e4m3fn, "cpu")
    assert len(caches) == 2 and caches[0].shape == (2, 5, 16, 3, 64)
    assert caches[0].dtype == torch.float8_e4m3fn


def windowed_reference(q, k, v, window):
    """Attention where query p sees keys p - window + 1 .. p."""
    n = q.shape[0]
    pos = torch.arange(n)
    diff = pos[:, None] - pos[None, :]
    mask = (diff >= 0) & (diff < window)
    rep = NH // NKV
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(rep, 1).transpose(0, 1),
        v.repeat_interleave(rep, 1).transpose(0, 1),
        attn_mask=mask,
        scale=HD**-0.5,
    )
    return out.transpose(0, 1).reshape(n, NH * HD)


def test_sliding_window_matches_windowed_reference_and_skips_old_blocks():
    """Chunked prefills and batched decodes with a 7-token window equal windowed dense
    attention, also when the blocks before each window hold garbage (as after the KV
    cache manager gave them to another request)."""
    window, bs = 7, 4
    layer = make_layer(block_size=bs, sliding_window=window)
    seqs = random_seqs([23, 19, 9], seed=5)
    chunks = [[10, 6, 1, 1, 1, 1, 1, 1, 1], [5, 8, 1, 1, 1, 1, 1, 1], [3, 3, 1, 1, 1]]
    original_forward = layer.impl.forward

    def forward_with_stale_blocks(lyr, query, key, value, attn_metadata, output):
        # Overwrite every block that lies wholly before the window of a request's first
        # query this step: attention must not depend on them.
        for i, (start, seq_len) in enumerate(
            zip(attn_metadata.query_start_loc_cpu[:-1], attn_metadata.seq_lens_cpu, strict=True)
        ):
            q_len = attn_metadata.query_start_loc_cpu[i + 1] - start
            first_key = max(0, seq_len - q_len - window + 1)
            for b in attn_metadata.block_tables[i][: first_key // bs].tolist():
                lyr.kv_cache[:, b] = 1e3 * torch.randn_like(lyr.kv_cache[:, b])
        return original_forward(lyr, query, key, value, attn_metadata, output)

    layer.impl.forward = forward_with_stale_blocks
    outs = run_schedule(layer, bs, seqs, chunks, seed=3)
    for out, q, k, v in zip(outs, *seqs, strict=True):
        n = out.shape[0]
        ref = windowed_reference(q[:n], k[:n], v[:n], window)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out, dense_reference(q[:n], k[:n], v[:n]), atol=1e-3)


def test_disable_sliding_window_makes_layers_attend_to_everything():
    from minivllm.config import VllmConfig
    from minivllm.config.vllm import set_current_vllm_config

    class _Model:
        disable_sliding_window = True

    cfg = VllmConfig()
    cfg.model_config = _Model()  # type: ignore[assignment]
    with set_current_vllm_config(cfg):
        layer = Attention(NH, HD, HD**-0.5, NKV, prefix="l9.attn", sliding_window=7)
    assert layer.sliding_window is None
    assert make_layer(sliding_window=7).sliding_window == 7


@pytest.mark.parametrize("limit", [0, 1 << 40])
def test_small_steps_run_attention_on_one_thread(monkeypatch, limit):
    """At or below SMALL_ATTENTION_WORK a step's attention runs on one thread (same
    results), above it on torch's threads; the thread count is restored after."""
    from minivllm.attention.backends import cpu_sdpa

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    real = cpu_sdpa._sdpa
    monkeypatch.setattr(cpu_sdpa, "SMALL_ATTENTION_WORK", limit)
    monkeypatch.setattr(
        cpu_sdpa, "_sdpa", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k)
    )
    try:
        lengths = [23, 5, 17, 9]
        seqs = random_seqs(lengths)
        chunks = [[10, 7, 1, 1, 1, 1, 1, 1], [0, 3, 1, 1], [17], [4, 1, 1, 1, 1, 1]]
        outs = run_schedule(make_layer(block_size=4), 4, seqs, chunks)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert set(seen) == ({1} if limit else {2})
    for i in range(len(lengths)):
        ref = dense_reference(seqs[0][i], seqs[1][i], seqs[2][i])
        torch.testing.assert_close(outs[i], ref, atol=1e-5, rtol=1e-5)


def _rss_anon() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_cpu_cache_is_zero_and_resident_only_where_written():
    """The CPU cache reads as zeros without having been written: start-up does not
    touch it, and the resident set grows with the blocks written, not the cache's size."""
    num_blocks, block_size, heads, head_dim = 2048, 16, 4, 64  # 32 MiB a layer in fp16
    gc.collect()  # earlier tests' garbage freed mid-test would blur the resident figures
    before = _rss_anon()
    caches = allocate_kv_caches(4, num_blocks, block_size, heads, head_dim, torch.float16, "cpu")
    allocated = _rss_anon() - before
    layer_bytes = caches[0].numel() * caches[0].element_size()
    assert allocated < layer_bytes // 4, (allocated, layer_bytes)
    assert all(c.shape == (2, num_blocks, block_size, heads, head_dim) for c in caches)
    assert caches[0].data_ptr() % 4096 == 0 and caches[0].is_contiguous()
    # Reads are zeros (the kernel's fresh pages), and the cache is writable in place.
    assert not caches[2].any()
    caches[2][1, 7].fill_(3.0)
    assert caches[2][1, 7].float().sum() == 3.0 * block_size * heads * head_dim
    assert caches[2].float().sum() == caches[2][1, 7].float().sum()
    caches[1].copy_(torch.ones_like(caches[1]))
    assert _rss_anon() - before >= layer_bytes * 3 // 4
