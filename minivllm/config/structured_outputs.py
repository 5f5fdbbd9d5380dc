"""`StructuredOutputsConfig`: the grammar engines that constrain generation.

A request that asks for a JSON schema, a regex, a choice or a grammar (see
`StructuredOutputsParams`) has its grammar compiled by one of two libraries:
xgrammar (``backend="xgrammar"``) or llguidance (``backend="guidance"``).  The
compiled grammar masks, at every step, the tokens that would break it.
"""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config, hash_factors
from minivllm.reasoning import get_reasoning_parser

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
    """Reasoning parser of a reasoning model (see `ReasoningConfig`; ``--reasoning-parser``
    sets both): a grammar then constrains only the answer after the reasoning."""
    reasoning_parser_plugin: str = ""
    """Path of a reasoning parser plugin; must be empty (minivllm loads no plugins)."""
    enable_in_reasoning: bool = False
    """Constrain the reasoning section too (with a reasoning parser, the grammar then
    applies from the first generated token)."""
    max_spec_bytes: int = 65536
    """Largest constraint a request may give, in bytes of its text: the JSON schema (as
    compact JSON), the regex, the grammar, the structural tag, or the choice list (as a
    JSON array).  Compile time and memory grow faster than the text (a 64 KiB regex
    compiles in ~1 s, a 256 KiB one in ~9 s), so a bigger one is refused with a 400."""
    max_spec_depth: int = 64
    """Deepest nesting (JSON objects and arrays, "const" and "enum" values included) of a
    JSON schema or structural tag; a deeper one is refused with a 400."""
    max_grammar_bytes: int = 64 << 20
    """Largest compiled grammar a request may bring, in bytes (xgrammar's own memory
    estimate; for llguidance, 4 bytes per character of the grammar it builds).  A bigger
    one is refused with a 400; must not exceed cache_max_bytes."""
    cache_max_bytes: int = 256 << 20
    """Bytes of compiled grammars kept for reuse (measured as for max_grammar_bytes);
    the least recently used are dropped first."""
    max_mask_ms: float = 200.0
    """Longest one request's grammar may take to compute its token mask for one step (or
    to advance over one token), in milliseconds.  A request over it ends alone with an
    error while the batch goes on (the mask is computed in a worker thread, so the step
    waits at most this long); at validation, a grammar over it in its first
    probe_steps steps, or still over half of it at the last of them (a mask whose cost
    grows with the output), is refused with a 400."""
    max_request_grammar_s: float = 5.0
    """Total seconds one request's grammar may spend on token masks and advances over
    the whole generation; a request over it ends alone with an error."""
    probe_steps: int = 8
    """Steps a newly compiled grammar is run through at validation (its shortest
    allowed token each time), timing each mask against max_mask_ms; a grammar whose
    mask allows no token there cannot be satisfied and is refused too.  0 disables."""

    def __post_init__(self) -> None:
        self.check_supported()
        self.check_limits()

    def check_limits(self) -> None:
        """ValueError for a limit that cannot work."""
        for name in ("max_spec_bytes", "max_spec_depth", "max_grammar_bytes", "cache_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"structured_outputs_config.{name} must be >= 1, got {getattr(self, name)}"
                )
        for name in ("max_mask_ms", "max_request_grammar_s"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"structured_outputs_config.{name} must be > 0, got {getattr(self, name)}"
                )
        if self.probe_steps < 0:
            raise ValueError(
                f"structured_outputs_config.probe_steps must be >= 0, got {self.probe_steps}"
            )
        if self.max_grammar_bytes > self.cache_max_bytes:
            raise ValueError(
                f"structured_outputs_config.max_grammar_bytes ({self.max_grammar_bytes}) must "
                f"not exceed cache_max_bytes ({self.cache_max_bytes}); raise cache_max_bytes"
            )

    def check_supported(self) -> None:
        """ValueError for a backend or option minivllm does not run."""
        if self.backend not in RUNNABLE_BACKENDS:
            raise ValueError(
                f"structured_outputs_config.backend={self.backend!r} is not supported by "
                f"minivllm; use one of {', '.join(map(repr, RUNNABLE_BACKENDS))}"
            )
        if self.reasoning_parser_plugin:
            raise ValueError(
                f"structured_outputs_config.reasoning_parser_plugin="
                f"{self.reasoning_parser_plugin!r}: minivllm loads no parser plugins; use "
                "--reasoning-parser with a built-in parser, or leave it unset"
            )
        if self.reasoning_parser:
            try:
                get_reasoning_parser(self.reasoning_parser)
            except ValueError as exc:
                raise ValueError(f"structured_outputs_config.reasoning_parser: {exc}") from None

    def compute_hash(self) -> str:
        """Grammars act on logits after the graph: no factors."""
        return hash_factors([])
