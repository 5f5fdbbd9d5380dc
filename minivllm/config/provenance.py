"""Where each resolved configuration value came from.

`minivllm config --explain` prints, for every field of a resolved
`VllmConfig`, whether the user set it, an optimization level or the platform
filled it in, a named resolution rule changed it, or it kept its default.

The mechanism is generic: a resolution step runs inside
``provenance.step(source, rule, reason)``; the fields whose values differ after
the step are attributed to it.  Values are compared through a flat
``{"compilation_config.mode": value}`` view of the config tree, so no rule has
to report what it touched by hand.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

Source = Literal["user", "level", "platform", "rule", "default"]


@dataclasses.dataclass
class Origin:
    """The origin of one field's value."""

    source: Source
    """user | level | platform | rule | default."""
    rule: str = ""
    """Name of the resolution step (e.g. ``_set_cudagraph_sizes``); empty for defaults."""
    reason: str = ""
    """Human-readable reason, e.g. "cudagraph_mode FULL_AND_PIECEWISE -> NONE: ..."."""
    before: Any = None
    """The value the field had before this step changed it."""


def _plain(value: Any) -> Any:
    """A comparable, printable form of a leaf value."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a tree of dataclasses into ``{"a.b.c": plain_value}``.

    Private fields (leading underscore) and fields marked
    ``metadata={"explain": False}`` are skipped.
    """
    out: dict[str, Any] = {}
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        out[prefix] = _plain(obj)
        return out
    for f in dataclasses.fields(obj):
        if f.name.startswith("_") or f.metadata.get("explain") is False:
            continue
        value = getattr(obj, f.name)
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flatten(value, path))
        else:
            out[path] = _plain(value)
    return out


class Provenance:
    """Records the origin of every field of one configuration tree."""

    def __init__(self, root: Any, user_paths: set[str] | None = None) -> None:
        self._root = root
        self.origins: dict[str, Origin] = {}
        # The previous step's "after" view, reused as the next step's "before":
        # resolution changes fields only inside steps, and flattening the whole tree
        # is the dominant cost of building a config.
        self._snapshot: dict[str, Any] | None = None
        for path in user_paths or ():
            self.origins[path] = Origin("user")

    def mark_user(self, paths: set[str]) -> None:
        """Mark ``paths`` (and every field below them) as set by the user."""
        for path in paths:
            self.origins[path] = Origin("user")

    @contextmanager
    def step(
        self, source: Source, rule: str, reason: str | Callable[[str, Any, Any], str] = ""
    ) -> Iterator[None]:
        """Attribute every field changed inside the block to this step.

        ``reason`` may be a function ``(path, before, after) -> str`` to word
        the reason per field.
        """
        before = self._snapshot if self._snapshot is not None else flatten(self._root)
        try:
            yield
        finally:
            after = self._snapshot = flatten(self._root)
        for path, value in after.items():
            if path in before and before[path] == value:
                continue
            old = before.get(path)
            text = reason(path, old, value) if callable(reason) else reason
            self.origins[path] = Origin(source, rule, text, old)

    def origin_of(self, path: str) -> Origin:
        """The origin of ``path``; a field under a user-set parent counts as user-set."""
        if path in self.origins:
            return self.origins[path]
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            parent = ".".join(parts[:i])
            if parent in self.origins and self.origins[parent].source == "user":
                return self.origins[parent]
        return Origin("default")

    def explain(self) -> dict[str, dict[str, Any]]:
        """``{path: {"value", "source", "rule", "reason"}}`` for every field."""
        result: dict[str, dict[str, Any]] = {}
        for path, value in flatten(self._root).items():
            o = self.origin_of(path)
            entry: dict[str, Any] = {"value": value, "source": o.source}
            if o.rule:
                entry["rule"] = o.rule
            if o.reason:
                entry["reason"] = o.reason
            result[path] = entry
        return result
