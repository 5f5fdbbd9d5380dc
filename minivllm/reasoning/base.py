"""`ReasoningParser`: splits a reasoning model's text into its reasoning and its answer.

A reasoning model writes ``<think> ... </think>`` (or its family's markers) before the
answer.  A parser finds the markers in the *text*, so a marker the tokenizer splits
over several tokens, or a stream delta that ends in the middle of one, is found all
the same: while streaming, a tail that could still grow into a marker is held back
until the next delta (or `finish_streaming`) decides it.

Rules shared by every parser here (vLLM's ``deepseek_r1`` / ``qwen3`` behaviour):

- the text before the end marker is reasoning, whether or not the start marker was
  generated (chat templates often put ``<think>`` in the prompt); the first start
  marker before the end marker is dropped;
- the text after the end marker is content (markers there are plain content);
- no end marker: everything is reasoning (the thinking was cut short);
- a parser made with ``thinking_enabled=False`` passes everything through as content
  (Qwen3's ``enable_thinking: false``: the template already closed the thinking).

One parser instance follows one generated text (one choice): make a new one per
choice with `new_reasoning_parser`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class DeltaReasoning:
    """What a piece of generated text adds: reasoning, content, or both (None: none)."""

    reasoning: str | None = None
    content: str | None = None

    def __bool__(self) -> bool:
        return bool(self.reasoning) or bool(self.content)


class ReasoningParser:
    """Finds the reasoning section of one generated text (whole, or delta by delta)."""

    name: ClassVar[str] = "base"
    """The ``--reasoning-parser`` name."""
    start_str: ClassVar[str] = "<think>"
    """The marker that opens the reasoning (the family's default)."""
    end_str: ClassVar[str] = "</think>"
    """The marker that closes it."""

    def __init__(
        self,
        start_str: str | None = None,
        end_str: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """``start_str`` / ``end_str`` replace the family's markers when given (non-empty);
        ``chat_template_kwargs`` are the request's (see `thinking_enabled`)."""
        self.start = start_str or type(self).start_str
        self.end = end_str or type(self).end_str
        if not self.start or not self.end:
            raise ValueError(
                f"reasoning parser {self.name!r} needs both markers; set reasoning_start_str "
                "and reasoning_end_str"
            )
        self.thinking_enabled = self.is_thinking_enabled(chat_template_kwargs or {})
        self._in_reasoning = self.thinking_enabled
        self._start_seen = False
        self._pending = ""

    def is_thinking_enabled(self, chat_template_kwargs: dict[str, Any]) -> bool:
        """Whether the request lets the model think (always, unless a family says how
        to turn it off)."""
        return True

    # -- whole text ---------------------------------------------------------------
    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of a finished text; an empty part is None.  (Uses a
        fresh copy of this parser: a stream in progress is not disturbed.)"""
        parser = type(self)(self.start, self.end)
        parser.thinking_enabled = parser._in_reasoning = self.thinking_enabled
        delta = parser.feed(model_output, final=True)
        return delta.reasoning, delta.content

    # -- streaming ------------------------------------------------------------------
    def extract_reasoning_streaming(
        self, delta_text: str, delta_token_ids: Sequence[int] = ()
    ) -> DeltaReasoning | None:
        """What ``delta_text`` (the next piece of the text) adds, or None while it is
        held back.  ``delta_token_ids`` are accepted for vLLM's signature; the markers
        are found in the text."""
        text = self._pending + delta_text
        self._pending = ""
        if not self._in_reasoning:
            return DeltaReasoning(content=text) if text else None
        if not self._start_seen:
            text = self._drop_start(text)
        end_at = text.find(self.end)
        if end_at >= 0:
            self._in_reasoning = False
            reasoning, content = text[:end_at], text[end_at + len(self.end) :]
            delta = DeltaReasoning(reasoning or None, content or None)
            return delta if delta else None
        keep = self._partial_marker_len(text)
        if keep:
            text, self._pending = text[:-keep], text[-keep:]
        return DeltaReasoning(reasoning=text) if text else None

    def feed(
        self, delta_text: str, delta_token_ids: Sequence[int] = (), final: bool = False
    ) -> DeltaReasoning:
        """`extract_reasoning_streaming` and, when ``final`` (the text is complete),
        `finish_streaming`, merged into one delta (an empty part is None)."""
        parts = [self.extract_reasoning_streaming(delta_text, delta_token_ids)]
        if final:
            parts.append(self.finish_streaming())
        reasoning = "".join(p.reasoning or "" for p in parts if p is not None)
        content = "".join(p.content or "" for p in parts if p is not None)
        return DeltaReasoning(reasoning or None, content or None)

    def finish_streaming(self) -> DeltaReasoning | None:
        """The text still held back once the generation has ended (a marker's prefix
        that never completed: reasoning, or content after the end marker)."""
        text, self._pending = self._pending, ""
        if not text:
            return None
        return (
            DeltaReasoning(reasoning=text) if self._in_reasoning else DeltaReasoning(content=text)
        )

    @property
    def reasoning_ended(self) -> bool:
        """Whether the text so far has closed its reasoning (what follows is content)."""
        return not self._in_reasoning

    def _drop_start(self, text: str) -> str:
        """``text`` without the first start marker (before the end marker only)."""
        start_at = text.find(self.start)
        end_at = text.find(self.end)
        if start_at >= 0 and (end_at < 0 or start_at < end_at):
            self._start_seen = True
            return text[:start_at] + text[start_at + len(self.start) :]
        return text

    def _partial_marker_len(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins a marker still awaited."""
        markers = [self.end] if self._start_seen else [self.end, self.start]
        for size in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
            tail = text[-size:]
            if any(m.startswith(tail) for m in markers):
                return size
        return 0
