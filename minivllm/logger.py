"""The package logger: ``init_logger(__name__)`` in every module."""

from __future__ import annotations

import logging
import sys

from minivllm import envs

_ROOT = "minivllm"
_configured = False


def _configure() -> None:
    global _configured
    if _configured:
        return
    root = logging.getLogger(_ROOT)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
        )
        root.addHandler(handler)
    root.setLevel(envs.log_level())
    _configured = True


def init_logger(name: str) -> logging.Logger:
    """A logger under the ``minivllm`` hierarchy."""
    _configure()
    return logging.getLogger(name if name.startswith(_ROOT) else f"{_ROOT}.{name}")
