"""`KVEventsConfig`: publishing KV cache events (block stored / removed).

Not supported by minivllm: only the inert default is accepted.
"""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config


@config
class KVEventsConfig(UnsupportedFeature):
    """Configuration for KV cache event publishing."""

    FEATURE: ClassVar[str] = "KV cache event publishing (kv_events_config)"

    enable_kv_cache_events: bool = False
    """Publish an event whenever a KV block is stored or removed."""
    publisher: str = "null"
    """Event transport ("null" publishes nothing; "zmq" in vLLM)."""
    endpoint: str = "tcp://*:5557"
    """ZMQ endpoint events are published on."""
    replay_endpoint: str | None = None
    """ZMQ endpoint for replaying missed events."""
    buffer_steps: int = 10_000
    """Steps of events kept for replay."""
    hwm: int = 100_000
    """ZMQ high-water mark."""
    max_queue_size: int = 100_000
    """Most events queued before publishing blocks."""
    topic: str = ""
    """Topic prefix of published events."""
