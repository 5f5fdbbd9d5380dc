"""uvicorn's h11 connection with the timeouts and limits it lacks against slow clients.

uvicorn times out only idle keep-alive connections: a client that sends its request
headers (or its body) one byte at a time, or never finishes them, holds a connection
and its buffers for as long as it likes, and a chunked body may declare a chunk of
2**48 bytes and then wait.  `GuardedH11Protocol` adds, per connection:

- a header timeout: the request line and headers must arrive within
  ``header_timeout_s`` of the connection opening or of the request's first byte
  (else a 408 and the connection closes);
- a body timeout: the whole body must arrive within ``body_timeout_s`` of the headers
  (else a 408 if no answer has started, and the connection closes);
- a chunk-size limit: a chunk declared larger than ``max_body_bytes`` gets a 413 at
  once and the connection closes (the body-size middleware counts the bytes that do
  arrive; this catches the declaration).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivllm.logger import init_logger

logger = init_logger(__name__)

DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5
"""--timeout-keep-alive default: seconds an idle keep-alive connection stays open."""
DEFAULT_HEADER_TIMEOUT_S = 10.0
"""--timeout-request-header default: seconds for a request line and headers to arrive."""
DEFAULT_BODY_TIMEOUT_S = 60.0
"""--timeout-request-body default: seconds for a whole request body to arrive (16 MiB
in a minute is ~280 KB/s)."""


@dataclass(frozen=True)
class HttpLimits:
    """The connection-level limits of `GuardedH11Protocol`."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """Seconds from a request's first byte (or the connection's opening) to the end of
    its headers."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """Seconds from the end of a request's headers to the end of its body."""
    max_body_bytes: int = 16 << 20
    """The largest chunk a chunked body may declare (the body limit itself)."""


def _raw_response(status: int, reason: str) -> bytes:
    # Written by hand: h11 sends no response before it has parsed a request.
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").encode(
        "ascii"
    )


class GuardedH11Protocol(H11Protocol):
    """uvicorn's `H11Protocol` plus the timeouts and the chunk limit of the module doc."""

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()  # also runs for pipelined requests after an answer
        if self.transport.is_closing():
            self._cancel_timers()
        else:
            self._follow_request_state()

    def _follow_request_state(self) -> None:
        """Run the timer of what the client still owes us: headers or body."""
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.conn.trailing_data[0]:
                self._arm_header_timer()  # part of a request's headers is here
            return
        self._cancel_header_timer()
        if state is not h11.SEND_BODY:
            self._cancel_body_timer()
            return
        if self._body_timer is None:
            self._body_timer = self.loop.call_later(
                self.limits.body_timeout_s, self._on_body_timeout
            )
        declared = getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0)
        if isinstance(declared, int) and declared > self.limits.max_body_bytes:
            logger.info("refused a body chunk of %d bytes (limit %d)", declared,
                        self.limits.max_body_bytes)  # fmt: skip
            self._close_with(413, "Content Too Large")

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._on_header_timeout
            )

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.conn.their_state is h11.IDLE and not answering:
            logger.debug("closed a connection whose request headers did not arrive in time")
            self._close_with(408, "Request Timeout")

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self.conn.their_state is h11.SEND_BODY:
            logger.info("closed a connection whose request body did not arrive in time")
            self._close_with(408, "Request Timeout")

    def _close_with(self, status: int, reason: str) -> None:
        self._cancel_timers()
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_raw_response(status, reason))
        # A route waiting for the body sees the client gone (http.disconnect).
        self.transport.close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()


def guarded_protocol(limits: HttpLimits) -> Any:
    """What to pass as uvicorn's ``http`` setting (it calls it once per connection)."""
    return functools.partial(GuardedH11Protocol, limits=limits)
