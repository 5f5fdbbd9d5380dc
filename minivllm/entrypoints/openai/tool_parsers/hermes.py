"""``hermes``: calls wrapped in ``<tool_call>...</tool_call>`` tags, each holding one
``{"name": ..., "arguments": {...}}`` object (Hermes, Qwen) or a list of them (SmolLM2)."""

from __future__ import annotations

import json
import re

from minivllm.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_json,
)

START, END = "<tool_call>", "</tool_call>"
# A closed call, or an unclosed one at the very end (generation stopped at EOS).
_CALL = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|\Z)", re.DOTALL)


def _strip_partial_end(text: str) -> str:
    for keep in range(min(len(END) - 1, len(text)), 0, -1):
        if END.startswith(text[-keep:]):
            return text[:-keep].rstrip()
    return text


class HermesToolParser(ToolParser):
    name = "hermes"

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(START)
        if start < 0:
            return text, []
        calls: list[ParsedToolCall] = []
        for match in _CALL.finditer(text, start):
            raw = match.group(1).strip()
            if not match.group(0).endswith(END):  # unclosed: drop a cut-off end tag
                raw = _strip_partial_end(raw)
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                return text, []  # a malformed call: hand the text back as content
            for item in body if isinstance(body, list) else [body]:
                call = call_from_json(item)
                if call is None:
                    return text, []
                calls.append(call)
        content = text[:start].strip()
        return content or None, calls

    def content_end(self, text: str) -> int:
        start = text.find(START)
        if start >= 0:
            return start
        # Hold back a suffix that could be the beginning of the start tag.
        for keep in range(min(len(START) - 1, len(text)), 0, -1):
            if START.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)
