"""``/v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API).

A request becomes a chat request (`translate`) that runs through `OpenAIServingChat`
(`chat_bridge`): templates, tools, stop sequences and the reasoning parser behave as
in /v1/chat/completions.  The answer's blocks become content blocks (reasoning as
``thinking``); a stream sends Anthropic's events: ``message_start``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``input_json_delta``) / ``content_block_stop``, then
``message_delta`` (stop reason, output tokens) and ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from minivllm.entrypoints.openai.anthropic.protocol import (
    CountTokensRequest,
    MessagesInput,
    MessagesRequest,
    MessagesResponse,
    MessagesUsage,
    TokenCount,
)
from minivllm.entrypoints.openai.anthropic.translate import (
    chat_messages,
    chat_tool_choice,
    chat_tools,
    content_block,
    response_format,
    stop_of,
    thinking_fields,
)
from minivllm.entrypoints.openai.chat_bridge import (
    BlockDelta,
    BlockEvent,
    BlockStart,
    BlockStop,
    Finish,
    Usage,
    block_events,
    blocks_of,
    chat_extensions,
    chat_request,
    run_chat,
)
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

_DELTAS = {"text": ("text_delta", "text"), "reasoning": ("thinking_delta", "thinking"),
           "tool_call": ("input_json_delta", "partial_json")}  # fmt: skip
"""Block kind -> (delta type, its text field)."""
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}  # fmt: skip
"""HTTP status -> Anthropic's error type (anything else: api_error)."""


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _event(kind: str, **fields: Any) -> str:
    body = {"type": kind, **fields}
    return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


class AnthropicServingMessages:
    """Handler of the Messages endpoints."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    def _chat_request(self, request: MessagesInput, **fields: Any) -> ChatCompletionRequest:
        """The chat request of ``request`` (with its vLLM extensions) and ``fields``."""
        choice = request.tool_choice
        messages = chat_messages(request)
        # A conversation that ends with the assistant's text is a prefill: the answer
        # continues it (Anthropic's behaviour).
        last = messages[-1]
        prefill = last["role"] == "assistant" and bool(last["content"]) and "tool_calls" not in last
        extensions = chat_extensions(request)
        self.chat.warn_unknown_fields(request)
        return chat_request(
            extensions,
            model=request.model,
            messages=messages,
            add_generation_prompt=not prefill,
            continue_final_message=prefill,
            tools=chat_tools(request),
            tool_choice=chat_tool_choice(choice),
            parallel_tool_calls=None if choice is None else not choice.disable_parallel_tool_use,
            **thinking_fields(request),
            **fields,
        )

    async def create_message(
        self, request: MessagesRequest
    ) -> MessagesResponse | AsyncIterator[str]:
        """The message, or its event stream (``stream``)."""
        model = self.chat.check_model(request.model)
        chat = self._chat_request(
            request,
            max_completion_tokens=request.max_tokens,
            stop=request.stop_sequences,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            response_format=response_format(request.output_config),
            stream=request.stream,
        )
        result = await run_chat(self.chat, chat)
        if not isinstance(result, ChatCompletionResponse):
            return _message_events(model, block_events(result))
        blocks, finish = blocks_of(result)
        stop_reason, stop_sequence = stop_of(finish, any(b.kind == "tool_call" for b in blocks))
        return MessagesResponse(
            model=model,
            content=[content_block(b) for b in blocks],
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            usage=MessagesUsage(
                input_tokens=finish.num_prompt_tokens, output_tokens=finish.num_output_tokens
            ),
        )

    async def count_tokens(self, request: CountTokensRequest) -> TokenCount:
        """The prompt's token count: the conversation rendered as /v1/messages would."""
        self.chat.check_model(request.model)
        chat = self._chat_request(request)
        shown = None
        if chat.tools and chat.tool_choice != "none":
            shown = [tool.model_dump(exclude_none=True) for tool in chat.tools]
        _, ids = await self.chat.render(chat, shown)
        return TokenCount(input_tokens=len(ids))


class _MessageStream:
    """Writes one message's events."""

    def __init__(self, model: str) -> None:
        usage = MessagesUsage(input_tokens=0, output_tokens=0)
        self.message = MessagesResponse(model=model, usage=usage)
        self.started = False
        self.kinds: dict[int, str] = {}
        """Block index -> its kind."""

    def on(self, event: BlockEvent) -> list[str]:
        out = []
        if not self.started:
            if isinstance(event, Usage):
                self.message.usage.input_tokens = event.num_prompt_tokens
            out.append(_event("message_start", message=self.message.model_dump(mode="json")))
            self.started = True
        if isinstance(event, BlockStart):
            self.kinds[event.index] = event.block.kind
            block = content_block(event.block)
            if event.block.kind == "tool_call":
                block["input"] = {}  # its JSON follows in input_json_delta events
            out.append(_event("content_block_start", index=event.index, content_block=block))
        elif isinstance(event, BlockDelta):
            kind, name = _DELTAS[self.kinds[event.index]]
            delta = {"type": kind, name: event.text}
            out.append(_event("content_block_delta", index=event.index, delta=delta))
        elif isinstance(event, BlockStop):
            out.append(_event("content_block_stop", index=event.index))
        elif isinstance(event, Finish):
            stop_reason, stop_sequence = stop_of(event, "tool_call" in self.kinds.values())
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            usage = {"output_tokens": event.num_output_tokens}
            out += [_event("message_delta", delta=delta, usage=usage), _event("message_stop")]
        return out


async def _message_events(model: str, events: AsyncIterator[BlockEvent]) -> AsyncIterator[str]:
    """The stream of one message (an error on the way: an ``error`` event)."""
    stream = _MessageStream(model)
    try:
        async for event in events:
            for line in stream.on(event):
                yield line
    except Exception as exc:
        error = OpenAIServingError.from_exception(exc)
        yield _event("error", error=anthropic_error(int(error.status), error.message)["error"])
