"""Reasoning (thinking) models: split the reasoning from the answer.

- `ReasoningParser` (text): ``extract_reasoning(text) -> (reasoning, content)`` for a
  finished text; ``extract_reasoning_streaming(delta_text, delta_token_ids)`` ->
  `DeltaReasoning` (or None while a possible marker is held back) for each delta, and
  ``finish_streaming()`` at the end.  One instance per generated text:
  ``new_reasoning_parser(name, start_str, end_str, chat_template_kwargs)``.
- `ThinkingGate` (token ids, for the engine): where one request stands relative to its
  reasoning section, so that a grammar constrains only the answer and a thinking
  budget can force the end marker.

Pure Python, the lowest layer: the config, the worker and the server all use it.
"""

from __future__ import annotations

from minivllm.reasoning.base import DeltaReasoning, ReasoningParser
from minivllm.reasoning.gate import ReasoningMarkers, ThinkingGate
from minivllm.reasoning.parsers import (
    REASONING_PARSERS,
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    StringReasoningParser,
    get_reasoning_parser,
    new_reasoning_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "DeepSeekR1ReasoningParser",
    "DeltaReasoning",
    "Qwen3ReasoningParser",
    "ReasoningMarkers",
    "ReasoningParser",
    "StringReasoningParser",
    "ThinkingGate",
    "get_reasoning_parser",
    "new_reasoning_parser",
]
