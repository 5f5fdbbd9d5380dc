"""`TcpConnector`, the scheduler half: disaggregated prefill between two engines.

The ``kv_transfer_params`` of a request say what to do, as with vLLM's NIXL
connector and its proxy examples:

- ``{"do_remote_decode": true}`` on the prefill instance (``kv_producer``): once
  the prompt is computed, the worker copies its KV (every token but the last) to
  a send buffer served on ``kv_ip:kv_port``, and the response carries
  ``{"do_remote_prefill": true, "remote_engine_id", "remote_host", "remote_port",
  "remote_request_id", "remote_num_tokens", "remote_block_ids"}``;
- those parameters on the decode instance (``kv_consumer``): the request waits in
  WAITING_FOR_REMOTE_KVS while the worker pulls the KV, then computes its last
  prompt token and decodes.  A producer that cannot be reached, or dies during the
  transfer, fails that request alone (or, with ``kv_load_failure_policy=
  "recompute"``, it computes its prompt itself).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from minivllm.kv_transfer.base import (
    ConnectorRequest,
    KVConnectorMetadata,
    KVConnectorScheduler,
    KVLoad,
    KVSave,
    ScheduledRequest,
)
from minivllm.math_utils import cdiv
from minivllm.stats import KVConnectorStats

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


def tokens_digest(token_ids: Sequence[int]) -> str:
    """What both sides compare so that KV never lands under another prompt."""
    return hashlib.sha256(struct.pack(f"<{len(token_ids)}q", *token_ids)).hexdigest()


def _as_int(value: Any) -> int:
    """A count from a request's kv_transfer_params; anything else counts as 0 (the
    prompt is computed here)."""
    if isinstance(value, bool):
        return 0
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


class TcpConnectorScheduler(KVConnectorScheduler):
    """Plans the producer's sends and the consumer's pulls."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        kv = vllm_config.kv_transfer_config
        assert kv is not None and vllm_config.cache_config.block_size is not None
        super().__init__(vllm_config.cache_config.block_size)
        self.engine_id = kv.engine_id
        self.host, self.port = kv.kv_ip, kv.kv_port
        self.is_producer, self.is_consumer = kv.is_kv_producer, kv.is_kv_consumer
        self._loads: list[KVLoad] = []
        self._pulled: set[str] = set()
        self._sent: dict[str, KVSave] = {}
        self.stats = KVConnectorStats()

    # -- consumer -----------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: ConnectorRequest, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        rid = request.request_id
        if not (self.is_consumer and params.get("do_remote_prefill")) or rid in self._pulled:
            return 0, False
        remote = min(_as_int(params.get("remote_num_tokens")), request.num_prompt_tokens - 1)
        self.stats.external_queries += request.num_prompt_tokens - num_computed_tokens
        num = max(0, remote - num_computed_tokens)
        self.stats.external_hits += num
        return num, num > 0

    def update_state_after_alloc(
        self, request: ConnectorRequest, block_ids: list[int], num_external_tokens: int
    ) -> None:
        params = request.kv_transfer_params or {}
        self._pulled.add(request.request_id)  # once: after a preemption it computes its prompt
        num_computed = getattr(request, "num_computed_tokens", 0)
        first = num_computed // self.block_size
        end = num_computed + num_external_tokens
        count = cdiv(end, self.block_size) - first
        source = {
            "host": params.get("remote_host"),
            "port": params.get("remote_port"),
            "engine_id": params.get("remote_engine_id"),
            "request_id": params.get("remote_request_id"),
            "first_block": first,
            "num_blocks": count,
            "digest": tokens_digest(list(request.all_token_ids[:end])),
        }
        load = KVLoad(request.request_id, block_ids[first : first + count], num_external_tokens)
        load.source = source
        self._loads.append(load)

    # -- producer -----------------------------------------------------------------
    def build_connector_meta(self, scheduled: Sequence[ScheduledRequest]) -> KVConnectorMetadata:
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        if not self.is_producer:
            return meta
        for item in scheduled:
            request = item.request
            params = request.kv_transfer_params or {}
            rid = request.request_id
            if not params.get("do_remote_decode") or rid in self._sent:
                continue
            if item.num_computed_tokens < request.num_prompt_tokens:
                continue  # the prompt is not all computed yet
            num_tokens = request.num_prompt_tokens - 1
            prompt = list(request.all_token_ids[:num_tokens])
            count = cdiv(num_tokens, self.block_size)
            save = KVSave(rid, item.block_ids[:count], num_tokens=num_tokens)
            save.digest = tokens_digest(prompt)
            self._sent[rid] = save
            meta.saves.append(save)
        return meta

    def request_finished(
        self, request: ConnectorRequest, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._pulled.discard(request.request_id)
        save = self._sent.pop(request.request_id, None)
        if save is None:
            return False, None
        return False, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_request_id": request.request_id,
            "remote_num_tokens": save.num_tokens,
            "remote_block_ids": save.block_ids,
            "tp_size": 1,
        }
