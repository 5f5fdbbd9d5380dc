"""The reasoning parsers by family, and the registry of their ``--reasoning-parser`` names."""

from __future__ import annotations

from typing import Any

from minivllm.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek R1 (and QwQ): ``<think> ... </think>``; R1's template writes ``<think>``
    into the prompt, so the output often holds only the end marker."""

    name = "deepseek_r1"


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: ``<think> ... </think>``; ``chat_template_kwargs: {"enable_thinking":
    false}`` makes the template close the thinking in the prompt, and then the whole
    output is content."""

    name = "qwen3"

    def is_thinking_enabled(self, chat_template_kwargs: dict[str, Any]) -> bool:
        return chat_template_kwargs.get("enable_thinking", True) is not False


class StringReasoningParser(ReasoningParser):
    """Any model: the markers are ``reasoning_start_str`` / ``reasoning_end_str``
    (`ReasoningConfig`), the rules are those of every parser (see `ReasoningParser`)."""

    name = "generic"
    start_str = ""
    end_str = ""


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    cls.name: cls
    for cls in (DeepSeekR1ReasoningParser, Qwen3ReasoningParser, StringReasoningParser)
}
"""Parser classes by their ``--reasoning-parser`` name."""


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class called ``name``; ValueError listing the known names."""
    cls = REASONING_PARSERS.get(name)
    if cls is None:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of "
            f"{', '.join(sorted(REASONING_PARSERS))}"
        )
    return cls


def new_reasoning_parser(
    name: str,
    start_str: str | None = None,
    end_str: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ReasoningParser:
    """A fresh parser for one generated text (``name`` "" means "generic"); the markers
    replace the family's when given; ValueError for an unknown name or missing markers."""
    cls = get_reasoning_parser(name or StringReasoningParser.name)
    return cls(start_str, end_str, chat_template_kwargs)
