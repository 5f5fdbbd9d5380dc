"""`GrammarSpec`: a request's constraint in normal form, the key of the compile cache,
and the protocol both backends implement."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from minivllm.structured_output.deadline import TimedMatcher
from minivllm.structured_output.limits import check_depth, check_schema, check_spec_size, load_json

if TYPE_CHECKING:
    import torch

    from minivllm.config.structured_outputs import StructuredOutputsConfig
    from minivllm.sampling_params import StructuredOutputsParams


GRAMMAR_ERROR_PREFIX = "structured output: "
"""How the error of a request whose grammar broke a limit mid-generation begins; the
server answers such a request with a 400 (the request brought the grammar)."""


@dataclass(frozen=True)
class GrammarSpec:
    """What to compile: the kind, its text, and the options that change the grammar."""

    kind: str
    """"json", "json_object", "regex", "choice", "grammar" or "structural_tag"."""
    text: str
    """The schema as canonical JSON, the regex, the JSON list of choices, the grammar."""
    any_whitespace: bool = True
    """JSON may hold free whitespace between tokens."""
    no_additional_properties: bool = False
    """Schema objects without "additionalProperties" accept no unlisted keys."""

    @classmethod
    def from_params(
        cls, params: StructuredOutputsParams, config: StructuredOutputsConfig
    ) -> GrammarSpec:
        """The spec of ``params`` under the engine's ``config``: ValueError for bad JSON,
        or a constraint over the size or depth limits or that nothing can enforce."""
        kind = params.kind
        text: str
        if kind == "json":
            schema: Any = params.json
            if isinstance(schema, str):
                schema = load_json(schema, "JSON schema", config)
            else:
                check_depth(schema, "JSON schema", config)
            if not isinstance(schema, (dict, bool)):
                raise ValueError("a JSON schema must be a JSON object")
            check_schema(schema)
            text = json.dumps(schema)
            check_spec_size(text, "JSON schema", config)
        elif kind == "choice":
            text = json.dumps(params.choice)
            check_spec_size(text, "choice list", config)
        elif kind == "json_object":
            text = '{"type": "object"}'
        else:
            text = str(getattr(params, kind))
            what = {"structural_tag": "structural tag"}.get(kind, kind)
            if kind == "structural_tag":
                load_json(text, what, config)
            else:
                check_spec_size(text, what, config)
        return cls(
            kind=kind,
            text=text,
            any_whitespace=not (params.disable_any_whitespace or config.disable_any_whitespace),
            no_additional_properties=(
                params.disable_additional_properties or config.disable_additional_properties
            ),
        )


class GrammarMatcher(Protocol):
    """One request's position in its grammar."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row ``row`` of an int32 bitmask
        (bit ``t % 32`` of word ``t // 32`` set = token t allowed)."""

    def accept_token(self, token_id: int) -> bool:
        """Advance over ``token_id``; False if the grammar rejects it."""

    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted."""


class GrammarBackend(Protocol):
    """A grammar library bound to one tokenizer."""

    name: str

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar; ValueError naming the problem if it is invalid."""

    def new_matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of ``compiled``."""

    def size_bytes(self, compiled: Any) -> int:
        """Memory estimate of ``compiled``, for the cache's byte bound."""


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled grammar and the backend that made it; requests share one instance."""

    spec: GrammarSpec
    backend: GrammarBackend
    compiled: Any

    size_bytes: int = 0
    """Memory estimate (see StructuredOutputsConfig.max_grammar_bytes)."""

    def new_matcher(self) -> TimedMatcher:
        return TimedMatcher(self.backend.new_matcher(self.compiled))
