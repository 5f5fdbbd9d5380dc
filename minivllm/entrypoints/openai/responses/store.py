"""The server's store of responses (``store: true``), bounded in size and age.

vLLM keeps every stored response for the life of the server; here the store holds at
most ``--responses-store-max-entries`` responses, each for at most
``--responses-store-max-age`` seconds: the oldest goes first when it is full, and an
expired one is gone (a later ``previous_response_id`` naming it is a 404, as for an
id never seen).  A background response evicted while it still runs is cancelled.

This module is light (no server imports): the CLI adds its flags before the server
is imported.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from minivllm.entrypoints.openai.responses.protocol import ResponsesResponse

DEFAULT_MAX_ENTRIES = 1000
"""Default --responses-store-max-entries."""
DEFAULT_MAX_AGE_S = 3600.0
"""Default --responses-store-max-age (one hour)."""


@dataclass(frozen=True)
class StoreLimits:
    """How many responses the store keeps, and for how long."""

    max_entries: int = DEFAULT_MAX_ENTRIES
    """The most responses kept (0: none are kept; ``store`` is then ignored)."""
    max_age_s: float = DEFAULT_MAX_AGE_S
    """Seconds a response is kept after it was created."""

    def __post_init__(self) -> None:
        if self.max_entries < 0:
            raise ValueError(
                f"argument --responses-store-max-entries: must be >= 0, got {self.max_entries}"
            )
        if not 0 < self.max_age_s < float("inf"):
            raise ValueError(
                "argument --responses-store-max-age: must be a number of seconds > 0, got "
                f"{self.max_age_s}"
            )


@dataclass
class StoredResponse:
    """A stored response and the conversation a follow-up continues."""

    response: ResponsesResponse
    messages: list[dict[str, Any]]
    """The chat messages of the conversation so far (instructions excluded), the
    answer included."""
    task: asyncio.Task[Any] | None = None
    """The task computing a background response, while it runs."""
    stored_at: float = field(default=0.0)


class ResponseStore:
    """Stored responses by id, oldest first."""

    def __init__(self, limits: StoreLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.limits.max_entries > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        """Keep ``entry`` (a stored id's entry is replaced in place, keeping its age)."""
        if not self.enabled:
            return
        key = entry.response.id
        old = self._entries.get(key)
        entry.stored_at = old.stored_at if old is not None else self._clock()
        self._entries[key] = entry
        self._expire()
        while len(self._entries) > self.limits.max_entries:
            _, evicted = self._entries.popitem(last=False)
            _stop(evicted)

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry of ``response_id``, or None when it was never stored or is gone."""
        self._expire()
        return self._entries.get(response_id)

    def _expire(self) -> None:
        cutoff = self._clock() - self.limits.max_age_s
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.stored_at > cutoff:
                return
            self._entries.popitem(last=False)
            _stop(oldest)


def _stop(entry: StoredResponse) -> None:
    if entry.task is not None and not entry.task.done():
        entry.task.cancel()


def add_store_arguments(group: argparse._ArgumentGroup) -> None:
    """The server flags of the store's limits."""
    group.add_argument(
        "--responses-store-max-entries",
        type=int,
        default=DEFAULT_MAX_ENTRIES,
        help="/v1/responses: the most stored responses kept (store: true); the oldest "
        f"goes first (default: {DEFAULT_MAX_ENTRIES}; 0 keeps none).",
    )
    group.add_argument(
        "--responses-store-max-age",
        type=float,
        default=DEFAULT_MAX_AGE_S,
        help="/v1/responses: seconds a stored response is kept after its creation "
        f"(default: {DEFAULT_MAX_AGE_S:g}).",
    )


def store_limits_of(args: argparse.Namespace) -> StoreLimits:
    """The store's limits from the server flags (ValueError for a bad value)."""
    return StoreLimits(
        max_entries=getattr(args, "responses_store_max_entries", DEFAULT_MAX_ENTRIES),
        max_age_s=getattr(args, "responses_store_max_age", DEFAULT_MAX_AGE_S),
    )
