"""Hostile-client tests: one real `minivllm serve` per test module.

A module states its server flags in ``SERVER_ARGS``; each module gets its own server
(so no module sees another's requests or metrics), which stops after its last test.

Servers start in pairs: a module that needs its server starts the next module's as
well and waits for both.  A start-up is ~7 s of mostly one-core work, so the two
share the machine's two cores (half the waiting), no test runs while a server starts,
and at most two servers are up at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_utils import RemoteServer

HERE = Path(__file__).resolve().parent


class _Servers:
    """The selected modules here that use ``server`` (in run order) and their servers."""

    def __init__(self, modules: dict[str, object]) -> None:
        self.modules = modules
        self.started: dict[str, RemoteServer] = {}

    def take(self, module: object) -> RemoteServer:
        name = module.__name__  # type: ignore[attr-defined]
        if name not in self.started:
            order = list(self.modules)
            nxt = order[order.index(name) + 1 : order.index(name) + 2] if name in order else []
            for key in [name, *nxt]:
                args = getattr(self.modules.get(key, module), "SERVER_ARGS", ())
                self.started[key] = RemoteServer(*args)
        remote = self.started.pop(name)
        remote.wait_ready()
        for other in self.started.values():
            try:
                other.wait_ready()
            except RuntimeError:
                pass  # its own module reports it (wait_ready raises there again)
        return remote


@pytest.fixture(scope="session")
def _servers(request: pytest.FixtureRequest) -> Iterator[_Servers]:
    modules: dict[str, object] = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        path = Path(getattr(module, "__file__", "") or "").resolve()
        if path.parent == HERE and "server" in getattr(item, "fixturenames", ()):
            modules[module.__name__] = module  # type: ignore[union-attr]
    servers = _Servers(modules)
    try:
        yield servers
    finally:
        for remote in servers.started.values():  # started for a module that never ran
            remote.stop()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, _servers: _Servers) -> Iterator[RemoteServer]:
    """The module's server, ready (/health answers 200)."""
    remote = _servers.take(request.module)
    try:
        yield remote
    finally:
        remote.stop()
