"""`ReasoningConfig`: reasoning (thinking) models.

A reasoning model writes its thinking between two markers (``<think> ... </think>``)
before the answer.  With a parser (``--reasoning-parser deepseek_r1|qwen3|generic``, or
just the two marker strings) the server returns the thinking apart from the answer
(``message.reasoning``), a structured-output grammar constrains only the answer, and a
request's ``thinking_token_budget`` ends the thinking by forcing the end marker.  The
markers' token ids are found with the model's tokenizer when the engine starts
(`initialize_token_ids`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minivllm.config.utils import config
from minivllm.reasoning import (
    REASONING_PARSERS,
    ReasoningMarkers,
    ReasoningParser,
    new_reasoning_parser,
)

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


@config
class ReasoningConfig:
    """Configuration for reasoning models."""

    reasoning_parser: str = ""
    """The reasoning parser: "deepseek_r1", "qwen3", or "generic" (the markers below);
    empty with both markers set means "generic"."""
    reasoning_start_str: str = ""
    """String that opens the reasoning (e.g. "<think>"); empty: the parser's own."""
    reasoning_end_str: str = ""
    """String that closes the reasoning (e.g. "</think>"); empty: the parser's own."""

    def __post_init__(self) -> None:
        self._start_token_ids: list[int] | None = None
        self._end_token_ids: list[int] | None = None
        name = self.reasoning_parser
        if not self.requested:
            return  # vLLM's empty config: no reasoning
        if name:
            if name not in REASONING_PARSERS:
                raise ValueError(
                    f"unknown reasoning_parser {name!r}; choose one of "
                    f"{', '.join(sorted(REASONING_PARSERS))}"
                )
        if not (self.start_str and self.end_str):
            raise ValueError(
                f"reasoning parser {self.parser_name!r} has no markers of its own; set "
                "both reasoning_start_str and reasoning_end_str (e.g. '<think>' and "
                "'</think>')"
            )
        if self.start_str == self.end_str:
            raise ValueError(
                "reasoning_start_str and reasoning_end_str must differ, both are "
                f"{self.start_str!r}"
            )

    @property
    def requested(self) -> bool:
        """Whether a parser or a marker is set (an empty config asks for nothing)."""
        return bool(self.reasoning_parser or self.reasoning_start_str or self.reasoning_end_str)

    @property
    def parser_name(self) -> str:
        """The parser in use ("generic" when only the markers are given)."""
        return self.reasoning_parser or "generic"

    @property
    def start_str(self) -> str:
        """The start marker in force (the user's, else the parser's)."""
        return self.reasoning_start_str or REASONING_PARSERS[self.parser_name].start_str

    @property
    def end_str(self) -> str:
        """The end marker in force (the user's, else the parser's)."""
        return self.reasoning_end_str or REASONING_PARSERS[self.parser_name].end_str

    @property
    def enabled(self) -> bool:
        """Whether the markers' token ids are known (`initialize_token_ids` ran)."""
        return self._start_token_ids is not None and self._end_token_ids is not None

    @property
    def reasoning_start_token_ids(self) -> list[int] | None:
        """Token ids of the start marker (set by `initialize_token_ids`)."""
        return self._start_token_ids

    @property
    def reasoning_end_token_ids(self) -> list[int] | None:
        """Token ids of the end marker (set by `initialize_token_ids`)."""
        return self._end_token_ids

    def initialize_token_ids(self, tokenizer: Any) -> None:
        """Tokenize the markers with the model's tokenizer; ValueError if one is empty.
        (vLLM passes the model config and loads the tokenizer; the engine has it.)"""
        if not self.requested:
            return
        start = list(tokenizer.encode(self.start_str, add_special_tokens=False))
        end = list(tokenizer.encode(self.end_str, add_special_tokens=False))
        if not start or not end:
            raise ValueError(
                f"the reasoning markers {self.start_str!r} / {self.end_str!r} give no tokens "
                "with this model's tokenizer; set reasoning_start_str and reasoning_end_str "
                "to strings of its vocabulary"
            )
        self._start_token_ids, self._end_token_ids = start, end

    def new_parser(self, chat_template_kwargs: dict[str, Any] | None = None) -> ReasoningParser:
        """A fresh text parser for one generated text (one choice) of a request with
        these chat template options (Qwen3 reads ``enable_thinking``)."""
        return new_reasoning_parser(
            self.parser_name,
            self.reasoning_start_str or None,
            self.reasoning_end_str or None,
            chat_template_kwargs,
        )

    def markers(self, gate_grammar: bool = True) -> ReasoningMarkers | None:
        """The markers' token ids for the engine, or None before `initialize_token_ids`."""
        if self._start_token_ids is None or self._end_token_ids is None:
            return None
        return ReasoningMarkers(
            tuple(self._start_token_ids), tuple(self._end_token_ids), gate_grammar
        )


def resolve_reasoning(cfg: VllmConfig) -> None:
    """One parser for both configs, as in vLLM (``--reasoning-parser`` sets both): an
    empty `ReasoningConfig` becomes None, and a parser named only in the structured
    outputs config gets its `ReasoningConfig`."""
    reasoning, structured = cfg.reasoning_config, cfg.structured_outputs_config
    if reasoning is not None and not reasoning.requested:
        reasoning = cfg.reasoning_config = None
    if reasoning is None:
        if structured.reasoning_parser:
            cfg.reasoning_config = ReasoningConfig(reasoning_parser=structured.reasoning_parser)
    elif reasoning.reasoning_parser and not structured.reasoning_parser:
        structured.reasoning_parser = reasoning.reasoning_parser
