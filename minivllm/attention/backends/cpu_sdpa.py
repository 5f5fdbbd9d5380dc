"""Attention over the paged KV cache with torch's scaled_dot_product_attention.

Written in plain torch, so it runs on any device; it is the CPU backend.
Decode rows (one query token) of all requests are batched into one padded SDPA
call with a key-padding mask; prefill rows (several query tokens, possibly
continuing a cached context) run one SDPA call per request with the causal mask
shifted so query ``i`` sees context positions ``<= seq_len - query_len + i``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.ops import gather_kv, gather_kv_batched, write_kv_cache


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


class CpuSdpaBackend:
    """Paged attention built from gathers and SDPA calls."""

    name = "CPU_SDPA"

    def write_kv(
        self, layer: Any, key: torch.Tensor, value: torch.Tensor, md: AttentionMetadata
    ) -> None:
        """Write this step's K/V ([T, nkv, hd]) into ``layer.kv_cache``."""
        write_kv_cache(key, value, layer.kv_cache, md.slot_mapping, layer.k_scale, layer.v_scale)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        md: AttentionMetadata | None,
        output: torch.Tensor,
    ) -> None:
        """Fill ``output`` [T, nh, hd] with attention of ``query`` [T, nh, hd]."""
        if md is None:
            # Profiling / dummy run: the batch is one causal sequence, no cache.
            out = _sdpa(
                query.transpose(0, 1)[None],
                key.transpose(0, 1)[None],
                value.transpose(0, 1)[None],
                layer.scale,
                is_causal=True,
            )
            output.copy_(out[0].transpose(0, 1))
            return

        qsl = md.query_start_loc_cpu
        if qsl is None:
            qsl = md.query_start_loc.tolist()
        seq_lens = md.seq_lens_cpu
        if seq_lens is None:
            seq_lens = md.seq_lens.tolist()
        num_reqs = len(seq_lens)
        decode_reqs = [i for i in range(num_reqs) if qsl[i + 1] - qsl[i] == 1]
        if len(decode_reqs) == num_reqs:
            self._decode(layer, query, md.block_tables, qsl[:-1], seq_lens, output)
        elif len(decode_reqs) > 1:
            idx = torch.tensor(decode_reqs, device=md.block_tables.device)
            self._decode(
                layer,
                query,
                md.block_tables.index_select(0, idx),
                [qsl[i] for i in decode_reqs],
                [seq_lens[i] for i in decode_reqs],
                output,
            )
        decode_set = set(decode_reqs) if len(decode_reqs) > 1 else set()
        for i in range(num_reqs):
            if i in decode_set:
                continue
            self._prefill_one(
                layer, query[qsl[i] : qsl[i + 1]], md.block_tables[i], seq_lens[i],
                output[qsl[i] : qsl[i + 1]],
            )  # fmt: skip

    def _prefill_one(
        self,
        layer: Any,
        q: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int,
        out: torch.Tensor,
    ) -> None:
        query_len = q.shape[0]
        if query_len == 0:
            return
        k, v = gather_kv(
            layer.kv_cache, block_table, seq_len, q.dtype, layer.k_scale, layer.v_scale
        )
        mask = None
        if 1 < query_len < seq_len:
            # The query is the tail of the sequence: shift the causal diagonal right.
            q_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        res = _sdpa(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            layer.scale,
            mask=mask,
            is_causal=query_len == seq_len and query_len > 1,
        )
        out.copy_(res[0].transpose(0, 1))

    def _decode(
        self,
        layer: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        token_ids: list[int],
        seq_lens: list[int],
        output: torch.Tensor,
    ) -> None:
        """One padded SDPA call for requests that each have a single query token."""
        max_len = max(seq_lens)
        k, v = gather_kv_batched(
            layer.kv_cache, block_tables, max_len, query.dtype, layer.k_scale, layer.v_scale
        )
        padded_len = k.shape[1]
        lens = torch.tensor(seq_lens, device=query.device)
        mask = torch.arange(padded_len, device=query.device)[None, :] < lens[:, None]
        rows = torch.tensor(token_ids, device=query.device)
        q = query.index_select(0, rows)[:, :, None, :]  # [B, nh, 1, hd]
        res = _sdpa(
            q, k.transpose(1, 2), v.transpose(1, 2), layer.scale, mask=mask[:, None, None, :]
        )
        output.index_copy_(0, rows, res[:, :, 0, :])
