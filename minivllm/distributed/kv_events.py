"""Publishing KV cache events out of the engine (vLLM's ``vllm.distributed.kv_events``).

The block pool logs its events (`minivllm.kv_cache.events`, which defines the wire
schema re-exported here); once per step the engine drains them into one
`KVEventBatch` and hands it to the publisher `EventPublisherFactory.create` made
from `KVEventsConfig`:

- `NullEventPublisher` ("null", or events off) drops it;
- `ZmqEventPublisher` ("zmq") queues it for its own thread, which numbers batches
  from 0 and sends each as a ZeroMQ multipart message ``[topic, seq, payload]``
  (``seq``: 8 bytes, big-endian; ``payload``: msgpack) on a PUB socket, keeping the
  last ``buffer_steps`` for replay.  With a ``replay_endpoint``, a ROUTER socket
  answers a request ``[start_seq]`` (8 bytes, big-endian; from a REQ or DEALER
  socket) with one message ``[seq, payload]`` per buffered batch from ``start_seq``
  on, then the end marker ``[END_SEQ, b""]`` (-1 as 8 signed bytes).
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from minivllm.config.kv_events import KVEventsConfig
from minivllm.kv_cache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)
from minivllm.logger import init_logger

logger = init_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence frame that ends a replay answer (its payload frame is empty)."""


class EventPublisher(ABC):
    """Sends event batches in order; stamps each with the engine's data parallel rank."""

    def __init__(self, data_parallel_rank: int = 0) -> None:
        self.data_parallel_rank = data_parallel_rank

    @abstractmethod
    def publish(self, events: EventBatch) -> None:
        """Send ``events`` after every batch published before it."""

    @abstractmethod
    def shutdown(self) -> None:
        """Send what is queued, then release the sockets."""


class NullEventPublisher(EventPublisher):
    """Publishes nothing (the default, and any config with events off)."""

    def publish(self, events: EventBatch) -> None:
        return

    def shutdown(self) -> None:
        return


def _open_socket(ctx: zmq.Context, kind: int, endpoint: str, name: str, bind: bool) -> zmq.Socket:
    """A socket of ``kind`` bound (or connected) at ``endpoint``; a clear ValueError
    when the address cannot be used (taken, or not an interface of this machine)."""
    sock = ctx.socket(kind)
    try:
        sock.bind(endpoint) if bind else sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ValueError(
            f"kv_events_config.{name}={endpoint!r} cannot be used: {exc}; choose a free "
            "address (another engine may be publishing there)."
        ) from None
    return sock


def binds(endpoint: str) -> bool:
    """vLLM's rule: wildcard, ``ipc://`` and ``inproc://`` endpoints are bound (stable
    side); any other address is connected to (a subscriber that binds)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher(EventPublisher):
    """PUB socket plus an optional ROUTER replay socket, served by one thread."""

    SHUTDOWN_TIMEOUT_S: float = 2.0
    POLL_S: float = 0.02
    """Longest a replay request waits while no batch is coming."""

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
    ) -> None:
        super().__init__(data_parallel_rank)
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._next_seq = 0
        ctx = zmq.Context.instance()
        self._pub = _open_socket(ctx, zmq.PUB, endpoint, "endpoint", binds(endpoint))
        self._pub.set_hwm(hwm)
        self._replay: zmq.Socket | None = None
        if replay_endpoint is not None:
            try:
                self._replay = _open_socket(
                    ctx, zmq.ROUTER, replay_endpoint, "replay_endpoint", bind=True
                )
            except ValueError:
                self._pub.close(linger=0)
                raise
        self._closed = False
        # The sockets are used by this thread only from now on.
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    def publish(self, events: EventBatch) -> None:
        if self._closed:
            raise RuntimeError("the KV event publisher is shut down")
        if events.data_parallel_rank is None:
            events.data_parallel_rank = self.data_parallel_rank
        self._queue.put(events)  # waits while max_queue_size batches are pending

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(self.SHUTDOWN_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("KV event publisher: %d batches left unsent.", self._queue.qsize())
            return  # the daemon thread still owns the sockets
        self._pub.close(linger=int(self.SHUTDOWN_TIMEOUT_S * 1000))
        if self._replay is not None:
            self._replay.close(linger=0)

    # -- the publisher thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                self._serve_replays()
            except Exception:  # replays are a service on the side: publishing goes on
                logger.exception("KV event publisher: a replay request failed")
            try:
                batch = self._queue.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            try:
                self._send(batch)
            except Exception:  # a batch that cannot go out must not stop the others
                logger.exception("KV event publisher: a batch could not be sent")

    def _send(self, batch: EventBatch) -> None:
        seq = self._next_seq
        self._next_seq += 1
        payload = self._encoder.encode(batch)
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replays(self) -> None:
        """Answer every waiting replay request from the buffer."""
        sock = self._replay
        while sock is not None and sock.poll(0):
            frames = sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning(
                    "KV event replay: ignored a malformed request (%d frames)", len(frames)
                )
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in self._buffer:
                if seq >= start_seq:
                    sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            sock.send_multipart((client, b"", END_SEQ, b""))


class EventPublisherFactory:
    """Publishers by `KVEventsConfig.publisher` name."""

    _registry: dict[str, Callable[..., EventPublisher]] = {
        "null": NullEventPublisher,
        "zmq": ZmqEventPublisher,
    }

    @classmethod
    def register_publisher(cls, name: str, ctor: Callable[..., EventPublisher]) -> None:
        if name in cls._registry:
            raise KeyError(f"KV event publisher {name!r} is already registered")
        cls._registry[name] = ctor

    @classmethod
    def create(cls, config: KVEventsConfig | None, data_parallel_rank: int = 0) -> EventPublisher:
        """The publisher ``config`` asks for (a `NullEventPublisher` when events are off)."""
        if config is None or not config.enable_kv_cache_events or config.publisher == "null":
            return NullEventPublisher(data_parallel_rank)
        ctor = cls._registry.get(config.publisher)
        if ctor is None:
            known = ", ".join(sorted(cls._registry))
            raise ValueError(
                f"Unknown KV event publisher {config.publisher!r}; use one of {known}."
            )
        kwargs: dict[str, Any] = {
            "endpoint": config.endpoint,
            "replay_endpoint": config.replay_endpoint,
            "buffer_steps": config.buffer_steps,
            "hwm": config.hwm,
            "max_queue_size": config.max_queue_size,
            "topic": config.topic,
        }
        return ctor(data_parallel_rank=data_parallel_rank, **kwargs)


__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventPublisher",
    "EventPublisherFactory",
    "KVCacheEvent",
    "KVEventBatch",
    "NullEventPublisher",
    "ZmqEventPublisher",
]
