"""`StructuredOutputsConfig`: the grammar engines that constrain generation.

A request that asks for a JSON schema, a regex, a choice or a grammar (see
`StructuredOutputsParams`) has its grammar compiled by one of two libraries:
xgrammar (``backend="xgrammar"``) or llguidance (``backend="guidance"``).  The
compiled grammar masks, at every step, the tokens that would break it.
"""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config, hash_factors

StructuredOutputsBackend = Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"]

RUNNABLE_BACKENDS = ("auto", "xgrammar", "guidance")
"""The backends minivllm runs; vLLM's "outlines" and "lm-format-enforcer" are refused."""


@config
class StructuredOutputsConfig:
    """Configuration for structured (guided) outputs."""

    backend: StructuredOutputsBackend = "auto"
    """Grammar engine: "xgrammar", "guidance" (llguidance), or "auto", which uses
    xgrammar and falls back to llguidance for a request xgrammar cannot compile."""
    disable_fallback: bool = False
    """With backend "auto", fail a request xgrammar cannot compile instead of trying
    llguidance."""
    disable_any_whitespace: bool = False
    """Generated JSON gets no free whitespace (no newlines or indentation between
    tokens): shorter outputs, and small models cannot loop on whitespace."""
    disable_additional_properties: bool = False
    """With llguidance, treat a JSON schema object without "additionalProperties" as
    if it said false (xgrammar already does so)."""
    reasoning_parser: str = ""
    """Reasoning parser for reasoning models; minivllm has none, so it must be empty."""
    reasoning_parser_plugin: str = ""
    """Path of a reasoning parser plugin; must be empty (no reasoning parsers)."""
    enable_in_reasoning: bool = False
    """Constrain the reasoning section too; needs a reasoning parser, so must be False."""

    def __post_init__(self) -> None:
        self.check_supported()

    def check_supported(self) -> None:
        """ValueError for a backend or option minivllm does not run."""
        if self.backend not in RUNNABLE_BACKENDS:
            raise ValueError(
                f"structured_outputs_config.backend={self.backend!r} is not supported by "
                f"minivllm; use one of {', '.join(map(repr, RUNNABLE_BACKENDS))}"
            )
        for name in ("reasoning_parser", "reasoning_parser_plugin", "enable_in_reasoning"):
            if getattr(self, name):
                raise ValueError(
                    f"structured_outputs_config.{name}={getattr(self, name)!r}: minivllm has "
                    "no reasoning parsers; leave it unset"
                )

    def compute_hash(self) -> str:
        """Grammars act on logits after the graph: no factors."""
        return hash_factors([])
