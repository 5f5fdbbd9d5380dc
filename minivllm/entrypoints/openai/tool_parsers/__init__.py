"""Tool-call parsers (``--tool-call-parser NAME``): find the tool calls in a model's text.

Each parser knows one model family's format: ``hermes`` (``<tool_call>{...}</tool_call>``,
the format of ChatML models such as Qwen, Hermes and SmolLM2, the default model) and
``llama3_json`` (a bare ``{"name": ..., "parameters": ...}`` object, Llama 3.x).
"""

from __future__ import annotations

from minivllm.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser
from minivllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from minivllm.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
}
"""Parser classes by their ``--tool-call-parser`` name."""


def get_tool_parser(name: str) -> ToolParser:
    """The parser called ``name``; ValueError listing the known names."""
    cls = TOOL_PARSERS.get(name)
    if cls is None:
        raise ValueError(
            f"unknown tool call parser {name!r}; choose one of {', '.join(sorted(TOOL_PARSERS))}"
        )
    return cls()


__all__ = ["TOOL_PARSERS", "ParsedToolCall", "ToolParser", "get_tool_parser"]
