"""`KVEventsConfig`: publishing KV cache events (blocks stored in / removed from the
prefix cache) for routers outside the engine.

``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}'``:
the block pool logs a `BlockStored` / `BlockRemoved` / `AllBlocksCleared` for every
change of its prefix cache (`minivllm.kv_cache.events`); once per engine step the
engine publishes the step's events as one `KVEventBatch` on a ZeroMQ PUB socket
(`minivllm.distributed.kv_events`): frames ``[topic, seq, payload]``, ``seq`` an
8-byte big-endian counter from 0.  A ROUTER socket on ``replay_endpoint`` sends
back the last ``buffer_steps`` batches from a given sequence number.
"""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config
from minivllm.logger import init_logger

logger = init_logger(__name__)

ZMQ_TRANSPORTS = ("tcp://", "ipc://", "inproc://")
"""Endpoint schemes the ZeroMQ publisher binds or connects to."""


@config
class KVEventsConfig:
    """Configuration for KV cache event publishing."""

    enable_kv_cache_events: bool = False
    """Record an event whenever a full KV block is stored in the prefix cache or leaves
    it, and when the cache is reset; the publisher sends them out."""
    publisher: Literal["null", "zmq"] = None  # type: ignore[assignment]
    """How events are sent: "zmq" (a ZeroMQ PUB socket) or "null" (nowhere).  Unset:
    "zmq" when enable_kv_cache_events is on, else "null"."""
    endpoint: str = "tcp://*:5557"
    """ZeroMQ endpoint of the PUB socket.  A wildcard address (``*``, ``::``), ``ipc://``
    or ``inproc://`` is bound; any other address is connected to (a subscriber that
    binds)."""
    replay_endpoint: str | None = None
    """ZeroMQ endpoint of the ROUTER socket that replays missed batches: a request
    carries a start sequence number (8 bytes, big-endian); the reply is each buffered
    batch from it as ``[seq, payload]``, then ``[-1 (8 bytes, signed), b""]``.  None:
    no replay."""
    buffer_steps: int = 10_000
    """Batches (one per engine step with events) kept for replay."""
    hwm: int = 100_000
    """ZeroMQ send high-water mark of the PUB socket: messages queued for a slow
    subscriber before new ones are dropped for it (0: no limit)."""
    max_queue_size: int = 100_000
    """Batches waiting for the publisher thread; a full queue makes the engine step
    wait for it."""
    topic: str = ""
    """First frame of every message; subscribers filter on its prefix."""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        for name, low in (("buffer_steps", 1), ("hwm", 0), ("max_queue_size", 1)):
            if getattr(self, name) < low:
                raise ValueError(
                    f"kv_events_config.{name} must be >= {low}, got {getattr(self, name)}."
                )
        _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_endpoint("replay_endpoint", self.replay_endpoint)
            if self.replay_endpoint == self.endpoint:
                raise ValueError(
                    f"kv_events_config.replay_endpoint is the publishing endpoint "
                    f"({self.endpoint!r}); give the replay socket its own address, "
                    'e.g. "tcp://*:5558".'
                )

    def warn_inert(self, enable_prefix_caching: bool) -> None:
        """vLLM's warnings for settings that publish nothing."""
        if self.enable_kv_cache_events and not enable_prefix_caching:
            logger.warning(
                "KV cache events are on, but prefix caching is not enabled. "
                "Use --enable-prefix-caching to enable."
            )
        if self.publisher != "null" and not self.enable_kv_cache_events:
            logger.warning(
                "KV cache events are disabled, but the scheduler is configured to publish "
                "them. Modify KVEventsConfig.enable_kv_cache_events to True to enable."
            )


def _check_endpoint(name: str, endpoint: str) -> None:
    """ValueError unless ``endpoint`` is a ZeroMQ address (tcp ones with a port)."""
    scheme = next((t for t in ZMQ_TRANSPORTS if endpoint.startswith(t)), None)
    address = endpoint[len(scheme) :] if scheme else ""
    host, _, port = address.rpartition(":") if scheme == "tcp://" else (address, "", "1")
    if not host or not (port.isdigit() or port == "*"):
        raise ValueError(
            f"kv_events_config.{name}={endpoint!r} is not a ZeroMQ endpoint; use "
            '"tcp://HOST:PORT" ("tcp://*:5557" binds every interface), "ipc://PATH" or '
            '"inproc://NAME".'
        )
