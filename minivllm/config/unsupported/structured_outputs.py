"""`StructuredOutputsConfig`: guided decoding backends.

minivllm keeps vLLM's fields; only the defaults are supported (no external
grammar backend, no reasoning parser).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, hash_factors

StructuredOutputsBackend = Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"]


@config
class StructuredOutputsConfig(UnsupportedFeature):
    """Configuration for structured (guided) outputs."""

    FEATURE: ClassVar[str] = (
        "structured outputs backends other than the default (structured_outputs_config)"
    )

    backend: StructuredOutputsBackend = "auto"
    """Grammar engine for guided decoding; only "auto" (minivllm's default)."""
    disable_fallback: bool = False
    """Do not fall back to another backend when a request is unsupported."""
    disable_any_whitespace: bool = False
    """Forbid free whitespace in generated JSON."""
    disable_additional_properties: bool = False
    """Forbid properties a JSON schema does not list."""
    reasoning_parser: str = ""
    """Reasoning parser for reasoning models (none supported: must be empty)."""
    reasoning_parser_plugin: str = ""
    """Path of a reasoning parser plugin (must be empty)."""
    enable_in_reasoning: bool = False
    """Apply the grammar inside the reasoning section too."""

    def compute_hash(self) -> str:
        """Guided decoding works on logits after the graph: no factors."""
        return hash_factors([])
