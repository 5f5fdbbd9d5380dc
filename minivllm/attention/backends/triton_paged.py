"""Paged attention on CUDA with Triton kernels, safe to capture in a CUDA graph.

Everything the kernels need comes from device tensors (no Python lists, no
host syncs), so a FULL CUDA graph captured at one padded size replays for any
batch of that size: per token, its request is found with ``searchsorted`` over
``query_start_loc`` and its context length from ``seq_lens``; padding tokens
(slot -1) write nothing and attend to nothing.  One program handles one
(token, query head) and streams the request's KV blocks with an online softmax;
for a sliding-window layer it starts at the block of the oldest key in the window.

Imported only on CUDA (see `minivllm.attention.backends.get_attn_backend`), so a
CPU install never imports triton.  Not exercised in CPU test runs; the ``gpu``
tests in tests/gpu/ check it against the SDPA backend and eager runs.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
from minivllm.attention.graph_buffers import GraphAttentionBuffers
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.paged_kv import is_fp8


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_c0, stride_cb, stride_cs, stride_ch,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
    IS_FP8: tl.constexpr, FP8_MAX: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + tok)
    valid = slot >= 0
    safe_slot = tl.where(valid, slot, 0)
    block = safe_slot // BLOCK_SIZE
    offset = safe_slot % BLOCK_SIZE
    d = tl.arange(0, HEAD_DIM_P2)
    # Padding tokens (slot -1) load and store nothing: their row length is 0.
    mask = d < tl.where(valid, HEAD_DIM, 0)
    k = tl.load(k_ptr + tok * stride_kt + head * stride_kh + d, mask=mask, other=0.0)
    v = tl.load(v_ptr + tok * stride_vt + head * stride_vh + d, mask=mask, other=0.0)
    if IS_FP8:
        k = tl.clamp(k.to(tl.float32) / tl.load(k_scale_ptr), -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) / tl.load(v_scale_ptr), -FP8_MAX, FP8_MAX)
    dst = cache_ptr + block * stride_cb + offset * stride_cs + head * stride_ch + d
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_c0, v.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _paged_attention_kernel(
    q_ptr, cache_ptr, out_ptr, req_ptr, ctx_ptr, tables_ptr, k_scale_ptr, v_scale_ptr,
    scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_c0, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // QUERIES_PER_KV
    req = tl.load(req_ptr + tok)
    ctx = tl.load(ctx_ptr + tok)
    # A sliding-window layer sees keys ctx - SLIDING_WINDOW .. ctx - 1 only: start at
    # the block of the first one (earlier blocks may already belong to other requests).
    first_key = 0
    if SLIDING_WINDOW > 0:
        first_key = tl.maximum(ctx - SLIDING_WINDOW, 0)
    d = tl.arange(0, HEAD_DIM_P2)
    dmask = d < HEAD_DIM
    q = tl.load(q_ptr + tok * stride_qt + head * stride_qh + d, mask=dmask, other=0.0)
    q = q.to(tl.float32)
    k_scale = tl.load(k_scale_ptr)
    v_scale = tl.load(v_scale_ptr)
    s_off = tl.arange(0, BLOCK_SIZE)
    m = tl.full([1], float("-inf"), tl.float32)
    denom = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM_P2], tl.float32)
    for b in range(first_key // BLOCK_SIZE, tl.cdiv(ctx, BLOCK_SIZE)):
        block = tl.load(tables_ptr + req * stride_bt + b)
        key_pos = b * BLOCK_SIZE + s_off
        smask = (key_pos < ctx) & (key_pos >= first_key)
        base = cache_ptr + block * stride_cb + kv_head * stride_ch
        ptrs = base + s_off[:, None] * stride_cs + d[None, :]
        lmask = smask[:, None] & dmask[None, :]
        k = tl.load(ptrs, mask=lmask, other=0.0).to(tl.float32) * k_scale
        scores = tl.sum(k * q[None, :], axis=1) * scale
        scores = tl.where(smask, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(ptrs + stride_c0, mask=lmask, other=0.0).to(tl.float32) * v_scale
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        denom = denom * alpha + tl.sum(p, axis=0)
        m = m_new
    out = acc / tl.maximum(denom, 1e-30)
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=dmask,
    )


def _token_info(
    attn_metadata: AttentionMetadata, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: its request index and its causal context length (0 for padding)."""
    cached = getattr(attn_metadata, "_triton_token_info", None)
    if cached is not None and cached[0].shape[0] == num_tokens:
        return cached
    qsl = attn_metadata.query_start_loc.long()
    tokens = torch.arange(num_tokens, device=qsl.device)
    num_rows = attn_metadata.seq_lens.shape[0]
    req = torch.searchsorted(qsl[1:], tokens, right=True).clamp_(max=num_rows - 1)
    seq_lens = attn_metadata.seq_lens.long()
    ctx = seq_lens[req] - qsl[req + 1] + tokens + 1
    valid = attn_metadata.slot_mapping[:num_tokens] >= 0
    ctx = torch.where(valid, ctx, torch.zeros_like(ctx)).to(torch.int32)
    info = (req.to(torch.int32), ctx)
    # Computed once per step and shared by every layer (and recorded once in a graph).
    attn_metadata._triton_token_info = info  # type: ignore[attr-defined]
    return info


class TritonPagedBackend:
    """Paged attention with Triton kernels; CUDA graph safe."""

    name = "TRITON_PAGED"

    def __init__(self) -> None:
        self._fallback = CpuSdpaBackend()

    @staticmethod
    def make_graph_buffers(
        max_num_reqs: int, max_blocks_per_req: int, max_num_tokens: int, device: torch.device
    ) -> GraphAttentionBuffers:
        """The persistent metadata tensors its full CUDA graphs read (the kernels take
        everything from device tensors, so one graph serves any batch of its size)."""
        return GraphAttentionBuffers(max_num_reqs, max_blocks_per_req, max_num_tokens, device)

    def write_kv(
        self, layer: Any, key: torch.Tensor, value: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> None:
        cache = layer.kv_cache
        t, nkv, hd = key.shape
        if t == 0:
            return
        fp8 = is_fp8(cache.dtype)
        _write_kv_kernel[(t, nkv)](
            key, value, cache, attn_metadata.slot_mapping, layer.k_scale, layer.v_scale,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3),
            BLOCK_SIZE=cache.shape[2], HEAD_DIM=hd, HEAD_DIM_P2=triton.next_power_of_2(hd),
            IS_FP8=fp8, FP8_MAX=float(torch.finfo(cache.dtype).max) if fp8 else 0.0,
        )  # fmt: skip

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: AttentionMetadata | None,
        output: torch.Tensor,
    ) -> None:
        if attn_metadata is None:
            # Start-up/profiling runs have no cache: plain causal SDPA, never captured.
            self._fallback.forward(layer, query, key, value, attn_metadata, output)
            return
        t, nh, hd = query.shape
        if t == 0:
            return
        cache = layer.kv_cache
        req, ctx = _token_info(attn_metadata, t)
        _paged_attention_kernel[(t, nh)](
            query, cache, output, req, ctx, attn_metadata.block_tables,
            layer.k_scale, layer.v_scale, layer.scale,
            query.stride(0), query.stride(1), output.stride(0), output.stride(1),
            cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3),
            attn_metadata.block_tables.stride(0),
            QUERIES_PER_KV=nh // cache.shape[3], BLOCK_SIZE=cache.shape[2],
            HEAD_DIM=hd, HEAD_DIM_P2=triton.next_power_of_2(hd),
            SLIDING_WINDOW=getattr(layer, "sliding_window", None) or 0,
        )  # fmt: skip


__all__ = ["TritonPagedBackend"]
