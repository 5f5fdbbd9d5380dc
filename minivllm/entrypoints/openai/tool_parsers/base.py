"""What every tool-call parser offers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class ParsedToolCall:
    """One call found in the text: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def call_from_json(
    obj: Any, argument_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ParsedToolCall | None:
    """A call from ``{"name": ..., "arguments"|"parameters": {...}}``, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in obj:
            arguments = obj[key]
            break
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(obj["name"], arguments)


class ToolParser:
    """Finds tool calls in generated text (whole, or the prefix seen so far)."""

    name = "base"

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """``(content, calls)`` of a finished text; with no call found, the content is
        the whole text and calls is empty."""
        raise NotImplementedError

    def content_end(self, text: str) -> int:
        """While streaming: how many leading characters of ``text`` are surely plain
        content (sent at once); the rest may be (or become) a tool call and is held
        back until the text is complete."""
        raise NotImplementedError
