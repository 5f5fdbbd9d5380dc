"""Hostile-client tests: one real `minivllm serve` per test module.

A module states its server flags in ``SERVER_ARGS``; the server starts once for the
module (so each module pays one start-up) and stops after its last test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_utils import RemoteServer


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    """The module's server, ready (/health answers 200)."""
    remote = RemoteServer(*getattr(request.module, "SERVER_ARGS", ()))
    try:
        remote.wait_ready()
        yield remote
    finally:
        remote.stop()
