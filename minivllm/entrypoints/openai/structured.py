"""Request fields that constrain the output: OpenAI's ``response_format``, vLLM's
``structured_outputs`` object and its older ``guided_*`` spellings.

`structured_outputs_of` turns whichever the request used into one
`StructuredOutputsParams` (ValueError, so a 400, for two at once or a bad value); the
engine then compiles the grammar, and an invalid schema, regex or grammar is a 400 too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.sampling_params import StructuredOutputsParams


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: a named schema (OpenAI's structured outputs)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: plain text, any JSON object, or a JSON schema."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputFields(BaseModel):
    """The constraint fields shared by chat and completion requests."""

    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    """vLLM's field: ``{"json": ...}``, ``{"regex": ...}``, ``{"choice": [...]}``,
    ``{"grammar": ...}`` or ``{"json_object": true}``, plus options."""
    guided_json: str | dict[str, Any] | None = None
    """Older vLLM spelling of ``structured_outputs.json``."""
    guided_regex: str | None = None
    """Older vLLM spelling of ``structured_outputs.regex``."""
    guided_choice: list[str] | None = None
    """Older vLLM spelling of ``structured_outputs.choice``."""
    guided_grammar: str | None = None
    """Older vLLM spelling of ``structured_outputs.grammar``."""
    guided_whitespace_pattern: str | None = None
    """Older vLLM spelling of ``structured_outputs.whitespace_pattern`` (unsupported)."""

    def structured_outputs_of_request(self) -> StructuredOutputsParams | None:
        """The request's constraint, or None (ValueError for a conflicting or bad one)."""
        found: list[tuple[str, dict[str, Any]]] = []
        if self.structured_outputs is not None:
            found.append(("structured_outputs", dict(self.structured_outputs)))
        guided = {
            "json": self.guided_json,
            "regex": self.guided_regex,
            "choice": self.guided_choice,
            "grammar": self.guided_grammar,
        }
        for kind, value in guided.items():
            if value is not None:
                found.append((f"guided_{kind}", {kind: value}))
        if self.guided_whitespace_pattern is not None and found:
            found[-1][1]["whitespace_pattern"] = self.guided_whitespace_pattern
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise ValueError(
                    'response_format of type "json_schema" needs json_schema.schema (the '
                    "JSON schema of the answer)"
                )
            found.append(("response_format", {"json": fmt.json_schema.json_schema}))
        if not found:
            return None
        if len(found) > 1:
            names = ", ".join(name for name, _ in found)
            raise ValueError(f"give one output constraint, not several ({names})")
        name, spec = found[0]
        try:
            return StructuredOutputsParams.from_dict(spec)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from None
