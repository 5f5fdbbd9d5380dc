"""Tools in chat: the request and response models of function calling, and how each
``tool_choice`` runs.

- ``none``: the tools are not shown to the template; the answer is plain content.
- a named function: the output is constrained to the JSON schema of that function's
  parameters, and the text is that call's arguments.
- ``required``: the output is constrained to a JSON list of ``{"name", "parameters"}``
  objects, one per call, over the request's tools.
- ``auto`` (the default when tools are given): the model answers freely and the
  server's ``--tool-call-parser`` finds the calls in its text; it needs
  ``--enable-auto-tool-choice``, as in vLLM.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.tool_parsers import ParsedToolCall, ToolParser
from minivllm.sampling_params import StructuredOutputsParams

AUTO_NEEDS_FLAGS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
"""vLLM's message for tool_choice "auto" on a server started without a parser."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionDefinition(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(_Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Model):
    name: str
    arguments: str


class ToolCall(_Model):
    id: str = Field(default_factory=lambda: random_tool_call_id())
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(_Model):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Model):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


def random_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_calls_of(calls: list[ParsedToolCall]) -> list[ToolCall]:
    return [ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


def whole_call_deltas(calls: list[ToolCall], first_index: int = 0) -> list[DeltaToolCall]:
    """Stream deltas that each carry one complete call (id, name, all arguments)."""
    return [
        DeltaToolCall(
            index=first_index + i,
            id=call.id,
            type="function",
            function=DeltaFunctionCall(name=call.function.name, arguments=call.function.arguments),
        )
        for i, call in enumerate(calls)
    ]


def _parameters(tool: ChatCompletionToolsParam) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    """How one chat request uses its tools."""

    mode: Literal["none", "auto", "required", "named"]
    template_tools: list[dict[str, Any]] | None
    """The tools handed to the chat template (None: no tools shown)."""
    named: str | None = None
    parser: ToolParser | None = None

    @classmethod
    def of(
        cls,
        tools: list[ChatCompletionToolsParam] | None,
        tool_choice: ToolChoice | None,
        parser: ToolParser | None,
        enable_auto: bool,
    ) -> ToolPlan | None:
        """The plan of a request, or None when it has no tools (ValueError for a choice
        that cannot run: an unknown function, or "auto" without a parser)."""
        if not tools:
            if tool_choice not in (None, "none"):
                raise ValueError("tool_choice needs tools; give tools or drop tool_choice")
            return None
        shown = [t.model_dump(exclude_none=True) for t in tools]
        choice = "auto" if tool_choice is None else tool_choice
        if choice == "none":
            return cls("none", None)
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in tools]
            if choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names the function {choice.function.name!r}, which is not "
                    f"among the request's tools ({', '.join(names)})"
                )
            return cls("named", shown, named=choice.function.name)
        if choice == "required":
            return cls("required", shown)
        if not enable_auto or parser is None:
            raise ValueError(AUTO_NEEDS_FLAGS)
        return cls("auto", shown, parser=parser)

    def constraint(
        self, tools: list[ChatCompletionToolsParam], parallel_tool_calls: bool | None = None
    ) -> StructuredOutputsParams | None:
        """The output constraint that enforces a named or required tool choice.

        The JSON has no free whitespace: the server reads it, nobody else, and small
        models otherwise tend to pad it with newlines until max_tokens.
        """
        if self.mode == "named":
            [tool] = [t for t in tools if t.function.name == self.named][:1]
            return StructuredOutputsParams(json=_parameters(tool), disable_any_whitespace=True)
        if self.mode == "required":
            options = [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t.function.name]},
                        "parameters": _parameters(t),
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ]
            item = options[0] if len(options) == 1 else {"anyOf": options}
            schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": item}
            if parallel_tool_calls is False:
                schema["maxItems"] = 1
            return StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        return None

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """``(content, tool calls)`` of a finished choice's text."""
        if self.mode == "named":
            assert self.named is not None
            return None, [ToolCall(function=FunctionCall(name=self.named, arguments=text))]
        if self.mode == "required":
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                return text, []  # cut short (max_tokens): give the text back
            return None, [
                ToolCall(
                    function=FunctionCall(
                        name=item["name"],
                        arguments=json.dumps(item["parameters"], ensure_ascii=False),
                    )
                )
                for item in items
            ]
        if self.mode == "auto":
            assert self.parser is not None
            content, calls = self.parser.extract(text)
            return content, tool_calls_of(calls)
        return text, []


def conversation_entry(message: Any) -> dict[str, Any]:
    """A request message as the chat template gets it: tool calls with their arguments
    parsed (templates index into them), tool results with their call id."""
    entry: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name is not None:
        entry["name"] = message.name
    tool_calls = getattr(message, "tool_calls", None)
    if tool_calls:
        calls = []
        for call in tool_calls:
            call = dict(call)
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            call["function"] = function
            calls.append(call)
        entry["tool_calls"] = calls
    tool_call_id = getattr(message, "tool_call_id", None)
    if tool_call_id is not None:
        entry["tool_call_id"] = tool_call_id
    return entry
