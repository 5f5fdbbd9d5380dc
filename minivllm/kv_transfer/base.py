"""The connector interface, vLLM's split into a scheduler half and a worker half.

The scheduler half (`KVConnectorScheduler`, torch-free) decides: how many prompt
tokens beyond the local prefix cache the outside holds
(`get_num_new_matched_tokens`), which blocks to fill once they are allocated
(`update_state_after_alloc`), what the worker moves this step
(`build_connector_meta`, sent inside the `SchedulerOutput`), and what a finished
request leaves behind (`request_finished`: the ``kv_transfer_params`` of the
response).  The worker half (`minivllm.kv_transfer.worker.KVConnectorWorker`)
moves the bytes and reports, inside the `ModelRunnerOutput`, which loads finished
(`KVConnectorOutput`).

Every load is asynchronous from the scheduler's point of view: a request whose KV
is being loaded waits in ``WAITING_FOR_REMOTE_KVS`` while the rest of the batch
runs; the worker reports how many tokens it loaded (a corrupt or missing block
ends the loaded prefix: the rest is computed) or why the load failed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from minivllm.kv_cache.hashing import BlockHash
from minivllm.stats import KVConnectorStats


class KVConnectorRole(enum.Enum):
    """Which half of a connector an object is."""

    SCHEDULER = 0
    WORKER = 1


@dataclass
class KVLoad:
    """Fill ``block_ids`` (in order) with ``num_tokens`` tokens of a request's KV."""

    req_id: str
    block_ids: list[int]
    num_tokens: int
    keys: list[str] = field(default_factory=list)
    """Per block, its storage key (storage and offload connectors)."""
    source: dict[str, Any] = field(default_factory=dict)
    """Where a network load comes from (host, port, the producer's request id...)."""


@dataclass
class KVSave:
    """Copy ``block_ids`` out of the pool: to storage under ``keys``, or (network
    producer, no keys) to the send buffer of ``req_id`` with ``num_tokens`` tokens."""

    req_id: str
    block_ids: list[int]
    keys: list[str] = field(default_factory=list)
    num_tokens: int = 0
    digest: str = ""
    """Network producer: digest of the tokens sent (the consumer checks it)."""


@dataclass
class KVConnectorMetadata:
    """What the worker half moves in one step (inside `SchedulerOutput`)."""

    loads: list[KVLoad] = field(default_factory=list)
    """Started before the forward pass, finished in the background."""
    saves: list[KVSave] = field(default_factory=list)
    """Done after the forward pass, before the blocks can be reused."""
    dropped_keys: list[str] = field(default_factory=list)
    """Offload tier: keys the scheduler half evicted from host memory (LRU)."""
    dropped_disk_keys: list[str] = field(default_factory=list)
    """Offload tier: keys the scheduler half evicted from the disk directory (LRU)."""


@dataclass
class KVConnectorOutput:
    """What the worker half reports after a step (inside `ModelRunnerOutput`)."""

    finished_loads: dict[str, int] = field(default_factory=dict)
    """Request id -> tokens loaded (a prefix of what was asked; fewer when a block was
    missing or corrupt)."""
    failed_loads: dict[str, str] = field(default_factory=dict)
    """Request id -> why its load failed (nothing usable was loaded)."""
    corrupt_keys: list[str] = field(default_factory=list)
    """Stored blocks found corrupt (dropped from the store; a miss from now on)."""
    stats: KVConnectorStats = field(default_factory=KVConnectorStats)
    """This step's counts."""

    def is_empty(self) -> bool:
        return not self.finished_loads and not self.failed_loads


class ConnectorRequest(Protocol):
    """What the scheduler half reads from a request (the scheduler's `Request`)."""

    @property
    def request_id(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def block_hashes(self) -> list[BlockHash]: ...

    @property
    def kv_transfer_params(self) -> dict[str, Any] | None: ...


class KVConnectorScheduler:
    """The scheduler half of a connector (torch-free)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def get_num_new_matched_tokens(
        self, request: ConnectorRequest, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """Tokens after the first ``num_computed_tokens`` (local hits) the outside
        holds, and whether they load asynchronously (always True here)."""
        raise NotImplementedError

    def update_state_after_alloc(
        self, request: ConnectorRequest, block_ids: list[int], num_external_tokens: int
    ) -> None:
        """The request's blocks are allocated (its whole table, ``block_ids``): plan
        the load of its ``num_external_tokens`` tokens after the local hits."""
        raise NotImplementedError

    def build_connector_meta(self, scheduled: Sequence[ScheduledRequest]) -> KVConnectorMetadata:
        """The step's metadata: the loads planned since the last step and the blocks
        of ``scheduled`` requests to save once this step has computed them."""
        raise NotImplementedError

    def request_finished(
        self, request: ConnectorRequest, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """A request finished: (whether its blocks must outlive it, the
        ``kv_transfer_params`` of its response)."""
        return False, None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """The worker's report of a step (e.g. to forget entries it found corrupt)."""

    def shutdown(self) -> None:
        """Release what the scheduler half holds."""


@dataclass
class ScheduledRequest:
    """A request of the step, as `build_connector_meta` sees it."""

    request: ConnectorRequest
    block_ids: list[int]
    """Its whole block table after this step's allocation."""
    num_computed_tokens: int
    """Tokens whose KV is in the cache once this step ran."""
