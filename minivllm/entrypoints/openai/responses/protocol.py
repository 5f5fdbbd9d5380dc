"""Request and response bodies of ``/v1/responses`` (OpenAI's field names).

``input`` items are kept as plain objects here and read one by one in `translate`,
so that an item of a type this server does not run is a 400 naming that type.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.entrypoints.openai.protocol import OpenAIBaseModel, OpenAIRequest, random_id
from minivllm.sampling_params import MAX_TEMPERATURE


class TextFormat(BaseModel):
    """``text.format``: plain text, any JSON object, or a named JSON schema (flat, unlike
    chat's ``response_format``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    """``text``: how the answer's text is shaped."""

    model_config = ConfigDict(extra="allow")

    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    """``reasoning``: accepted for compatibility; how much a model thinks is up to its
    reasoning parser and chat template here."""

    model_config = ConfigDict(extra="allow")

    effort: str | None = None
    summary: str | None = None


class FunctionToolChoice(BaseModel):
    """``tool_choice`` naming one function."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    name: str


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    """A user message's text, or a list of items: messages (``role`` + ``content``),
    ``function_call``, ``function_call_output`` and ``reasoning`` items."""
    instructions: str | None = None
    """A system message put first (not carried over by ``previous_response_id``)."""
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    """Function tools: ``{"type": "function", "name", "description", "parameters"}``."""
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    """Keep the response for GET /v1/responses/{id} and ``previous_response_id`` (in
    the server's bounded store)."""
    previous_response_id: str | None = None
    """Continue the conversation of a stored response (404 when it is not stored)."""
    background: bool = False
    """Answer at once (status "queued") and run in the background; poll with GET, stop
    with POST /v1/responses/{id}/cancel.  Needs ``store``."""
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    priority: int = 0
    """vLLM's extension: the request's scheduling priority."""


class OutputText(OpenAIBaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(OpenAIBaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("msg"))
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("fc"))
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"


class ReasoningItem(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("rs"))
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "completed"


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


class InputTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(OpenAIBaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(OpenAIBaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(OpenAIBaseModel):
    code: str = "server_error"
    message: str


ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class ResponsesResponse(OpenAIBaseModel):
    """A response object (``object: "response"``)."""

    id: str = Field(default_factory=lambda: random_id("resp"))
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: ResponseStatus = "in_progress"
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
