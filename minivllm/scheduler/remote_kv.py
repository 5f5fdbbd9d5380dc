"""The scheduler's use of a KV connector: requests waiting for their KV to load.

When a waiting request is admitted, the connector may hold KV for prompt tokens
past the local prefix-cache hit.  Their blocks are allocated at once and the
request waits in ``WAITING_FOR_REMOTE_KVS`` (out of the running batch, which goes
on without it) while the worker loads them.  Once the worker reports the load,
the tokens it loaded count as computed, their blocks are published in the prefix
cache, and the request goes back to the front of the waiting queue holding its
blocks; it computes what is left (at least its last prompt token).  A failed
load ends the request with an error (``kv_load_failure_policy="fail"``) or
leaves the tokens to compute (``"recompute"``); a request aborted while loading
keeps its blocks until the load ends, as the worker may still be writing them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from minivllm.kv_cache.blocks import KVCacheBlocks
from minivllm.kv_cache.manager import KVCacheManager
from minivllm.kv_transfer.base import KVConnectorOutput, KVConnectorScheduler, ScheduledRequest
from minivllm.scheduler.request import Request, RequestStatus
from minivllm.stats import KVConnectorStats, PromptTokenStats

if TYPE_CHECKING:
    from minivllm.kv_transfer.base import KVConnectorMetadata


class RemoteKV:
    """Requests whose KV a connector is loading, and what the worker reported."""

    def __init__(
        self, connector: KVConnectorScheduler, manager: KVCacheManager, failure_policy: str
    ) -> None:
        self.connector = connector
        self.manager = manager
        self.recompute_on_failure = failure_policy == "recompute"
        self.loading: dict[str, Request] = {}
        """Requests in WAITING_FOR_REMOTE_KVS."""
        self.aborted: dict[str, Request] = {}
        """Requests finished while loading: their blocks are freed when the load ends."""
        self._reports: dict[str, int | str] = {}
        self.external_tokens: dict[str, int] = {}
        """Tokens each admitted request got from the connector (for the prompt stats)."""
        self.stats = KVConnectorStats()
        """Cumulative counts the worker reported."""

    def start_load(self, request: Request, hits: KVCacheBlocks, num_hit: int) -> bool | None:
        """Start loading what the connector holds past ``num_hit`` tokens.  True: the
        request now waits for its KV; None: nothing to load; False: no blocks for it."""
        num_external, _ = self.connector.get_num_new_matched_tokens(request, num_hit)
        if num_external <= 0:
            return None
        num_external = min(num_external, request.num_tokens - 1 - num_hit)
        if num_external <= 0:
            return None
        # Blocks for the whole prompt, not only the loaded part: a loaded request then
        # needs no new block to run, so requests holding loaded KV can never wait on
        # each other for room.
        if self.manager.allocate_slots(request, request.num_tokens - num_hit, hits) is None:
            return False
        request.num_computed_tokens = num_hit
        block_ids = self.manager.get_block_ids(request.request_id)
        self.connector.update_state_after_alloc(request, block_ids, num_external)
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.loading[request.request_id] = request
        return True

    def abort(self, request: Request) -> None:
        del self.loading[request.request_id]
        self.aborted[request.request_id] = request

    def record(self, output: KVConnectorOutput | None) -> None:
        """The worker's report of a step."""
        if output is None:
            return
        self.stats.add(output.stats)
        self.connector.update_connector_output(output)
        self._reports.update(output.finished_loads)
        self._reports.update(output.failed_loads)

    def collect(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Requests whose load ended: (ready to compute the rest, failed with an error)."""
        ready: list[Request] = []
        failed: list[tuple[Request, str]] = []
        reports, self._reports = self._reports, {}
        for req_id, report in reports.items():
            done = self.aborted.pop(req_id, None)
            if done is not None:
                self.manager.free(done)
                continue
            request = self.loading.pop(req_id, None)
            if request is None:
                continue
            if isinstance(report, str) and not self.recompute_on_failure:
                failed.append((request, report))
                continue
            loaded = report if isinstance(report, int) else 0
            request.num_computed_tokens += loaded
            self.external_tokens[req_id] = loaded
            self.manager.cache_blocks(request, request.num_computed_tokens)
            request.status = RequestStatus.WAITING
            ready.append(request)
        return ready, failed

    def holds_blocks(self, request: Request) -> bool:
        """Whether a waiting request came back from a load (it keeps its blocks)."""
        return self.manager.num_table_blocks(request.request_id) > 0

    def build_meta(self, scheduled: list[Request]) -> KVConnectorMetadata:
        items = [
            ScheduledRequest(r, self.manager.get_block_ids(r.request_id), r.num_computed_tokens)
            for r in scheduled
        ]
        return self.connector.build_connector_meta(items)

    def finished(self, request: Request) -> dict[str, Any] | None:
        """The connector's ``kv_transfer_params`` for a finished request's response."""
        self.external_tokens.pop(request.request_id, None)
        _, params = self.connector.request_finished(
            request, self.manager.get_block_ids(request.request_id)
        )
        return params

    def holds_blocks_for_loads(self, waiting: Iterable[Request]) -> bool:
        """Whether blocks are held by loads or by loaded requests waiting to run (they
        come back: a request short of room waits for them instead of failing)."""
        return bool(self.loading or self.aborted) or any(self.holds_blocks(r) for r in waiting)

    def has_work(self) -> bool:
        return bool(self.loading or self.aborted or self._reports)

    def cumulative_stats(self) -> KVConnectorStats:
        stats = self.stats.copy()
        own = getattr(self.connector, "stats", None)
        if own is not None:
            stats.external_queries += own.external_queries
            stats.external_hits += own.external_hits
        return stats


def count_prompt_sources(
    stats: PromptTokenStats, request: Request, num_hit: int, external: int
) -> None:
    """Split a request's prompt by source at its first admission."""
    prompt = request.num_prompt_tokens
    local_hit = max(0, min(num_hit - external, prompt))
    external = min(external, prompt - local_hit)
    stats.local_cache_hit += local_hit
    stats.external_kv_transfer += external
    stats.local_compute += prompt - local_hit - external
