"""The part of `VllmConfig` that `Scheduler.from_config` reads, as Protocols.

The scheduler is torch-free and type-checked on its own (mypy runs on the core
only), so it does not import `minivllm.config`, which pulls in torch; these
Protocols name the fields it reads, and `VllmConfig` satisfies them structurally.
"""

from __future__ import annotations

from typing import Protocol


class SchedulerFields(Protocol):
    """Fields of `SchedulerConfig` (both limits are filled by its ``__post_init__``)."""

    @property
    def max_num_seqs(self) -> int | None: ...

    @property
    def max_num_batched_tokens(self) -> int | None: ...

    @property
    def max_num_scheduled_tokens(self) -> int | None: ...

    @property
    def enable_chunked_prefill(self) -> bool: ...

    @property
    def policy(self) -> str: ...

    @property
    def long_prefill_token_threshold(self) -> int: ...

    @property
    def max_num_partial_prefills(self) -> int: ...

    @property
    def max_long_partial_prefills(self) -> int: ...

    @property
    def scheduler_reserve_full_isl(self) -> bool: ...


class CacheFields(Protocol):
    """Fields of `CacheConfig` (``block_size`` is None until the config is resolved)."""

    @property
    def block_size(self) -> int | None: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @property
    def prefix_caching_hash_algo(self) -> str: ...


class ModelFields(Protocol):
    """Fields of `ModelConfig` (``max_model_len`` is filled by its ``__post_init__``)."""

    @property
    def max_model_len(self) -> int | None: ...


class SpeculativeFields(Protocol):
    """Fields of `SpeculativeConfig`."""

    @property
    def disable_by_batch_size(self) -> int | None: ...


class ParallelFields(Protocol):
    """Fields of `ParallelConfig`."""

    @property
    def pipeline_parallel_size(self) -> int: ...


class KVEventsFields(Protocol):
    """Fields of `KVEventsConfig`."""

    @property
    def enable_kv_cache_events(self) -> bool: ...


class SchedulingConfig(Protocol):
    """What `Scheduler.from_config` reads from a `VllmConfig`."""

    @property
    def speculative_config(self) -> SpeculativeFields | None: ...

    @property
    def num_speculative_tokens(self) -> int: ...

    @property
    def num_lookahead_tokens(self) -> int: ...

    @property
    def parallel_config(self) -> ParallelFields: ...

    @property
    def scheduler_config(self) -> SchedulerFields: ...

    @property
    def cache_config(self) -> CacheFields: ...

    @property
    def model_config(self) -> ModelFields | None: ...

    @property
    def kv_events_config(self) -> KVEventsFields | None: ...
