"""Attention over the paged KV cache with torch's scaled_dot_product_attention.

Written in plain torch, so it runs on any device; it is the CPU backend.
Decode rows (one query token) of all requests are batched into one padded SDPA
call with a key-padding mask, the query heads that share a KV head folded into
rows of that head; prefill rows (several query tokens, possibly
continuing a cached context) run one SDPA call per request with the causal mask
shifted so query ``i`` sees context positions ``<= seq_len - query_len + i``.

Everything that depends only on the step's metadata (which requests decode, their
padded key mask, the slots to write) is worked out once per step in a `StepPlan`
and reused by every layer: per layer only the gathers and the SDPA calls remain.
A step whose attention is small (a single decode token over a short context, the
batch-1 decode step) runs it on one thread: SDPA's parallel loop over a few heads
costs more in waking and joining the other OpenMP threads (tens of microseconds
each time, far more on a loaded machine) than the work itself, and every layer
pays it.  Larger steps keep torch's thread count.

Sliding-window layers get a plan of their own (one per window size): query ``p``
sees keys ``p - window + 1 .. p``; a prefill gathers only the blocks from the first
key any of its queries sees, so blocks that fell out of the window (which the KV
cache manager may have handed to another request) are never read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from minivllm import envs
from minivllm.attention.backends.row_attention import native_row_attention, row_attention
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.ops import gather_kv, gather_kv_batched, store_kv, valid_slots
from minivllm.math_utils import cdiv, round_up

SMALL_ATTENTION_WORK = 1 << 21
"""Query-key products (times heads x head size) of a step at or below which its
attention runs on one thread: ~2M multiply-adds, some 100 us on one core, so a
batch-1 decode step up to a context of a few thousand tokens (9 heads of 64)."""


@contextmanager
def one_thread(enabled: bool) -> Iterator[None]:
    """Run the block with torch (OpenMP) on one thread when ``enabled``; setting the
    thread count costs well under a microsecond and the pool is kept."""
    threads = torch.get_num_threads()
    if not enabled or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """SDPA on [B, H, Lq, D] queries and [B, Hkv, Lk, D] keys/values (GQA allowed)."""
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )


@dataclass
class DecodeGroup:
    """The requests of a step that have exactly one query token."""

    rows: torch.Tensor | None
    """Their query rows in the flat batch; None when they are rows ``0..n-1``."""
    num: int
    block_tables: torch.Tensor
    max_seq_len: int
    key_mask: torch.Tensor
    """bool [n, 1, 1, L]: which of the ``L`` gathered key positions are real."""


@dataclass
class PrefillSpan:
    """One request with several query tokens."""

    req: int
    start: int
    end: int
    seq_len: int
    mask: torch.Tensor | None
    """Causal mask shifted to the end of a cached context; None for a plain causal
    prompt (SDPA's ``is_causal``) or a single row."""
    first_block: int = 0
    """First block of the table that any query sees (non-zero with a sliding window)."""


@dataclass
class StepPlan:
    """What every layer's attention needs of one step's metadata."""

    write_slots: torch.Tensor
    write_rows: torch.Tensor | None
    """Token rows whose K/V are written; None when it is every row."""
    decode: DecodeGroup | None
    prefills: list[PrefillSpan]
    key_work: int = 0
    """Sum over requests of query tokens x keys they see (see `SMALL_ATTENTION_WORK`)."""


def build_step_plan(
    attn_metadata: AttentionMetadata, block_size: int, sliding_window: int | None = None
) -> StepPlan:
    """Derive a `StepPlan` from ``attn_metadata`` (runs once per step and window, not per layer)."""
    device = attn_metadata.block_tables.device
    qsl = attn_metadata.query_start_loc_cpu
    if qsl is None:
        qsl = attn_metadata.query_start_loc.tolist()
    seq_lens = attn_metadata.seq_lens_cpu
    if seq_lens is None:
        seq_lens = attn_metadata.seq_lens.tolist()
    num_reqs = len(seq_lens)
    write_slots, write_rows = valid_slots(
        attn_metadata.slot_mapping, attn_metadata.num_actual_tokens
    )
    decode_reqs = [i for i in range(num_reqs) if qsl[i + 1] - qsl[i] == 1]
    if len(decode_reqs) <= 1:
        decode_reqs = []  # a lone decode row is as cheap on the prefill path
    decode = None
    if decode_reqs:
        decode = _decode_group(
            attn_metadata, qsl, seq_lens, decode_reqs, block_size, sliding_window
        )
    prefills = []
    decode_set = set(decode_reqs)
    for i in range(num_reqs):
        query_len = qsl[i + 1] - qsl[i]
        if i in decode_set or query_len == 0:
            continue
        seq_len = seq_lens[i]
        mask = None
        first_block = 0
        if sliding_window is not None and seq_len > sliding_window:
            first_key = max(0, seq_len - query_len - sliding_window + 1)
            first_block = first_key // block_size
            q_pos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
            k_pos = torch.arange(first_block * block_size, seq_len, device=device)[None, :]
            mask = (k_pos <= q_pos) & (k_pos > q_pos - sliding_window)
        elif 1 < query_len < seq_len:
            # The query is the tail of the sequence: shift the causal diagonal right.
            q_pos = torch.arange(seq_len - query_len, seq_len, device=device)
            mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
        prefills.append(PrefillSpan(i, qsl[i], qsl[i + 1], seq_len, mask, first_block))
    key_work = sum((qsl[i + 1] - qsl[i]) * seq_lens[i] for i in range(num_reqs))
    return StepPlan(write_slots, write_rows, decode, prefills, key_work)


def _decode_group(
    attn_metadata: AttentionMetadata,
    qsl: list[int],
    seq_lens: list[int],
    decode_reqs: list[int],
    block_size: int,
    sliding_window: int | None,
) -> DecodeGroup:
    """The padded batch of one-token requests; with a sliding window each request's
    table starts at the block of its window's first key (so a long context gathers
    only about a window of keys, and never the blocks freed before it)."""
    device = attn_metadata.block_tables.device
    lens = [seq_lens[i] for i in decode_reqs]
    all_decode = len(decode_reqs) == len(seq_lens)
    tables = (
        attn_metadata.block_tables
        if all_decode
        else attn_metadata.block_tables.index_select(0, torch.tensor(decode_reqs, device=device))
    )
    lens_t = torch.tensor(lens, device=device)[:, None]
    if sliding_window is None:
        max_len = max(lens)
        padded = round_up(max_len, block_size)
        key_pos = torch.arange(padded, device=device)[None, :]
        key_mask = key_pos < lens_t
    else:
        first = [max(0, n - sliding_window) // block_size for n in lens]
        num_blocks = max(cdiv(n, block_size) - f for n, f in zip(lens, first, strict=True))
        first_t = torch.tensor(first, device=device)[:, None]
        cols = (first_t + torch.arange(num_blocks, device=device)[None, :]).clamp_(
            max=tables.shape[1] - 1
        )
        tables = tables.gather(1, cols.to(tables.dtype))
        max_len = num_blocks * block_size
        key_pos = first_t * block_size + torch.arange(max_len, device=device)[None, :]
        key_mask = (key_pos < lens_t) & (key_pos >= lens_t - sliding_window)
    token_rows = [qsl[i] for i in decode_reqs]
    contiguous = token_rows == list(range(len(token_rows)))
    return DecodeGroup(
        rows=None if contiguous else torch.tensor(token_rows, device=device),
        num=len(decode_reqs),
        block_tables=tables,
        max_seq_len=max_len,
        key_mask=key_mask[:, None, None, :],
    )


class CpuSdpaBackend:
    """Paged attention built from gathers and SDPA calls."""

    name = "CPU_SDPA"

    def plan(self, layer: Any, attn_metadata: AttentionMetadata) -> StepPlan:
        """This step's plan, built by the first layer that asks."""
        # getattr: layers built before sliding windows existed (test stand-ins) lack it.
        window = getattr(layer, "sliding_window", None)
        key = self.name if window is None else f"{self.name}/window={window}"
        plan = attn_metadata.backend_plan.get(key)
        if plan is None:
            assert layer.kv_cache is not None
            plan = build_step_plan(attn_metadata, layer.kv_cache.shape[2], window)
            attn_metadata.backend_plan[key] = plan
        return plan

    def write_kv(
        self, layer: Any, key: torch.Tensor, value: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> None:
        """Write this step's K/V ([T, nkv, hd]) into ``layer.kv_cache``."""
        plan = self.plan(layer, attn_metadata)
        if plan.write_rows is not None:
            key, value = (
                key.index_select(0, plan.write_rows),
                value.index_select(0, plan.write_rows),
            )
        store_kv(key, value, layer.kv_cache, plan.write_slots, layer.k_scale, layer.v_scale)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: AttentionMetadata | None,
        output: torch.Tensor,
    ) -> None:
        """Fill ``output`` [T, nh, hd] with attention of ``query`` [T, nh, hd]."""
        if attn_metadata is None:
            # Profiling / dummy run: the batch is one causal sequence, no cache.
            window = getattr(layer, "sliding_window", None)
            t = query.shape[0]
            mask = None
            if window is not None and t > window:
                pos = torch.arange(t, device=query.device)
                diff = pos[:, None] - pos[None, :]
                mask = (diff >= 0) & (diff < window)
            out = _sdpa(
                query.transpose(0, 1)[None],
                key.transpose(0, 1)[None],
                value.transpose(0, 1)[None],
                layer.scale,
                mask=mask,
                is_causal=mask is None,
            )
            output.copy_(out[0].transpose(0, 1))
            return
        if envs.batch_invariant():
            # Every pair on one thread whatever the thread count: the kernel may
            # use all of them; the SDPA rows run on one.
            if not native_row_attention(layer, query, attn_metadata, output):
                with one_thread(True):
                    row_attention(layer, query, attn_metadata, output)
            return
        plan = self.plan(layer, attn_metadata)
        small = plan.key_work * query.shape[1] * query.shape[2] <= SMALL_ATTENTION_WORK
        with one_thread(small):
            if plan.decode is not None:
                self._decode(layer, query, plan.decode, output)
            for span in plan.prefills:
                self._prefill_one(
                    layer, query[span.start : span.end], attn_metadata.block_tables[span.req], span,
                    output[span.start : span.end],
                )  # fmt: skip

    def _prefill_one(
        self,
        layer: Any,
        q: torch.Tensor,
        block_table: torch.Tensor,
        span: PrefillSpan,
        out: torch.Tensor,
    ) -> None:
        query_len = q.shape[0]
        skipped = span.first_block * layer.kv_cache.shape[2]
        k, v = gather_kv(
            layer.kv_cache,
            block_table[span.first_block :],
            span.seq_len - skipped,
            q.dtype,
            layer.k_scale,
            layer.v_scale,
        )
        num_heads, num_kv_heads = q.shape[1], k.shape[1]
        if query_len == 1 and span.mask is None and num_heads != num_kv_heads:
            # One row sees its whole context: fold the query heads that share a KV head
            # into rows of it, as `_decode` does (SDPA's GQA path is slower here).
            grouped = q.view(1, num_kv_heads, num_heads // num_kv_heads, q.shape[2])
            res = _sdpa(grouped, k.transpose(0, 1)[None], v.transpose(0, 1)[None], layer.scale)
            out.copy_(res.view(1, num_heads, q.shape[2]))
            return
        res = _sdpa(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            layer.scale,
            mask=span.mask,
            is_causal=span.mask is None and query_len == span.seq_len and query_len > 1,
        )
        out.copy_(res[0].transpose(0, 1))

    def _decode(
        self, layer: Any, query: torch.Tensor, group: DecodeGroup, output: torch.Tensor
    ) -> None:
        """One padded SDPA call for requests that each have a single query token."""
        k, v = gather_kv_batched(
            layer.kv_cache,
            group.block_tables,
            group.max_seq_len,
            query.dtype,
            layer.k_scale,
            layer.v_scale,
        )
        if group.rows is None:
            q = query[: group.num]
        else:
            q = query.index_select(0, group.rows)
        # GQA without enable_gqa: the G query heads that share a KV head become G
        # query rows of that head (they sit at one position, so no causal mask is
        # needed).  SDPA's own GQA path is several times slower on CPU for one-token
        # queries, bfloat16 worst of all.
        n, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[2]
        grouped = q.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        res = _sdpa(grouped, k.transpose(1, 2), v.transpose(1, 2), layer.scale, group.key_mask)
        res = res.reshape(n, num_heads, head_dim)
        if group.rows is None:
            output[: group.num].copy_(res)
        else:
            output.index_copy_(0, group.rows, res)
