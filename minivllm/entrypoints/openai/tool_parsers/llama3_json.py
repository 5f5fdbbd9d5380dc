"""``llama3_json``: the answer is one or more JSON objects ``{"name": ...,
"parameters": {...}}`` separated by ``;``, optionally after ``<|python_tag|>``
(Llama 3.1-3.3's JSON tool calling)."""

from __future__ import annotations

import json

from minivllm.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_json,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder = json.JSONDecoder()
        calls: list[ParsedToolCall] = []
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return text, []
            call = call_from_json(obj, ("parameters", "arguments"))
            if call is None:
                return text, []
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return None, calls

    def content_end(self, text: str) -> int:
        body = text.lstrip()
        if not body:
            return 0  # nothing seen yet: could still open a call
        if body.startswith("{") or PYTHON_TAG.startswith(body[: len(PYTHON_TAG)]):
            return 0  # a call (or the tag that opens one) from the start: hold it all
        return len(text)
