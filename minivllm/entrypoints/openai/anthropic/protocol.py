"""Request and response bodies of ``/v1/messages`` and ``/v1/messages/count_tokens``
(Anthropic's field names).

Content blocks are kept as plain objects here and read one by one in `translate`, so
that a block of a type this server does not run is a 400 naming that type.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.protocol import OpenAIBaseModel, OpenAIRequest, random_id
from minivllm.sampling_params import MAX_TEMPERATURE


class AnthropicMessage(BaseModel):
    """One turn: ``content`` is text or a list of content blocks (text, tool_use,
    tool_result; thinking blocks of earlier turns are left out of the prompt)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicTool(BaseModel):
    """A client tool: its name, description and the JSON schema of its input."""

    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None
    """None or "custom"; Anthropic's server tools (web search, code execution, ...)
    are not run here."""


class AnthropicToolChoice(BaseModel):
    """``auto``, ``any`` (some tool), ``tool`` (the one named) or ``none``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesInput(OpenAIRequest):
    """What a prompt is made of (shared by messages and count_tokens)."""

    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = None
    """``{"type": "disabled"}`` asks the chat template not to think
    (``enable_thinking: false``, as Qwen3's reads it); ``{"type": "enabled",
    "budget_tokens": N}`` caps the thinking at N tokens (``thinking_token_budget``,
    with --reasoning-parser)."""


class MessagesRequest(MessagesInput):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    """``{"format": {"type": "json_schema", "schema": {...}}}`` constrains the answer to
    the schema (the structured-outputs path); ``effort`` is accepted and not used."""


class CountTokensRequest(MessagesInput):
    """``POST /v1/messages/count_tokens``."""


class MessagesUsage(OpenAIBaseModel):
    input_tokens: int
    output_tokens: int


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessagesResponse(OpenAIBaseModel):
    """A message (``type: "message"``)."""

    id: str = Field(default_factory=lambda: random_id("msg"))
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessagesUsage


class TokenCount(OpenAIBaseModel):
    input_tokens: int


class AnthropicErrorInfo(OpenAIBaseModel):
    type: str
    message: str


class AnthropicErrorResponse(OpenAIBaseModel):
    """``{"type": "error", "error": {"type", "message"}}``: every error answer of the
    /v1/messages endpoints."""

    type: Literal["error"] = "error"
    error: AnthropicErrorInfo
