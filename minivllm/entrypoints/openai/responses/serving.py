"""``/v1/responses``: create (whole, streamed or in the background), retrieve and
cancel responses.

A request becomes a chat request (`translate`) that runs through `OpenAIServingChat`
(`chat_bridge`), so templates, tools, structured outputs and the reasoning parser
behave exactly as in /v1/chat/completions; the answer's blocks become output items.
With ``store`` the response and its conversation are kept in the bounded
`ResponseStore` for GET and ``previous_response_id``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from minivllm.entrypoints.openai.chat_bridge import (
    Block,
    Finish,
    block_events,
    blocks_of,
    chat_extensions,
    chat_request,
    run_chat,
)
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse
from minivllm.entrypoints.openai.responses.protocol import (
    ResponseError,
    ResponsesRequest,
    ResponsesResponse,
)
from minivllm.entrypoints.openai.responses.store import ResponseStore, StoredResponse
from minivllm.entrypoints.openai.responses.stream import ResponseStream, response_events
from minivllm.entrypoints.openai.responses.translate import (
    assistant_message,
    chat_tool_choice,
    chat_tools,
    end_status,
    input_messages,
    output_items,
    response_format,
    usage_of,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError
from minivllm.logger import init_logger

logger = init_logger(__name__)

_RUNNING = ("queued", "in_progress")


def not_found(response_id: str, what: str = "Response") -> OpenAIServingError:
    return OpenAIServingError(
        f"{what} with id {response_id!r} not found (never stored, or evicted from the "
        "server's bounded store)",
        HTTPStatus.NOT_FOUND,
        param="previous_response_id" if what != "Response" else None,
    )


class OpenAIServingResponses:
    """Handler of the Responses endpoints."""

    def __init__(self, chat: OpenAIServingChat, store: ResponseStore) -> None:
        self.chat = chat
        self.store = store

    async def create_response(
        self, request: ResponsesRequest
    ) -> ResponsesResponse | AsyncIterator[str]:
        """The response, its event stream (``stream``), or at once a queued response
        (``background``)."""
        model = self.chat.check_model(request.model)
        extensions = chat_extensions(request)
        self.chat.warn_unknown_fields(request)
        history = self._history(request.previous_response_id)
        conversation = history + input_messages(request)
        chat = _chat_request_of(request, conversation, extensions)
        response = _response_of(request, model, self.store.enabled)
        _check_modes(request, response)
        if request.background:
            return self._start_background(chat, response, conversation)
        result = await run_chat(self.chat, chat)
        if isinstance(result, ChatCompletionResponse):
            blocks, finish = blocks_of(result)
            response.output = output_items(blocks)
            self._close(response, conversation, blocks, finish)
            return response
        self._keep(response, conversation)
        stream = ResponseStream(response)

        def close(finish: Finish) -> None:
            blocks = [_block_of(item) for item in response.output]
            self._close(response, conversation, blocks, finish)

        return response_events(stream, block_events(result), close)

    def retrieve(self, response_id: str) -> ResponsesResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise not_found(response_id)
        return entry.response

    def cancel(self, response_id: str) -> ResponsesResponse:
        """Stop a background response that is still running (400 for any other)."""
        entry = self.store.get(response_id)
        if entry is None:
            raise not_found(response_id)
        response = entry.response
        if not response.background:
            raise OpenAIServingError("only a background response can be cancelled")
        if response.status not in _RUNNING or entry.task is None:
            raise OpenAIServingError(f"cannot cancel a response whose status is {response.status}")
        entry.task.cancel()
        response.status = "cancelled"
        return response

    def _history(self, previous_response_id: str | None) -> list[dict[str, Any]]:
        if previous_response_id is None:
            return []
        entry = self.store.get(previous_response_id)
        if entry is None:
            raise not_found(previous_response_id, "Previous response")
        if entry.response.status in _RUNNING:
            raise OpenAIServingError(
                f"the previous response {previous_response_id!r} is still running; wait "
                "until it has completed",
                param="previous_response_id",
            )
        return [dict(message) for message in entry.messages]

    def _keep(
        self, response: ResponsesResponse, messages: list[dict[str, Any]]
    ) -> StoredResponse | None:
        if not response.store:
            return None
        entry = StoredResponse(response, messages)
        self.store.put(entry)
        return entry

    def _close(
        self,
        response: ResponsesResponse,
        conversation: list[dict[str, Any]],
        blocks: list[Block],
        finish: Finish,
    ) -> None:
        """Set the answer's status and usage; store the response with its conversation."""
        response.status, response.incomplete_details = end_status(finish)  # type: ignore[assignment]
        if response.status == "incomplete" and response.output:
            response.output[-1].status = "incomplete"  # the item max_output_tokens cut
        response.usage = usage_of(finish)
        self._keep(response, [*conversation, assistant_message(blocks)])

    def _start_background(
        self,
        chat: ChatCompletionRequest,
        response: ResponsesResponse,
        conversation: list[dict[str, Any]],
    ) -> ResponsesResponse:
        response.status = "queued"
        entry = self._keep(response, conversation)
        assert entry is not None  # _check_modes: background needs store
        answer = response.model_copy(deep=True)
        entry.task = asyncio.create_task(self._run_background(chat, entry))
        return answer

    async def _run_background(self, chat: ChatCompletionRequest, entry: StoredResponse) -> None:
        response = entry.response
        response.status = "in_progress"
        try:
            result = await run_chat(self.chat, chat)
            assert isinstance(result, ChatCompletionResponse)
            blocks, finish = blocks_of(result)
            response.output = output_items(blocks)
            self._close(response, entry.messages, blocks, finish)
        except asyncio.CancelledError:
            response.status = "cancelled"
        except Exception as exc:
            logger.warning("background response %s failed: %s", response.id, exc)
            response.status = "failed"
            error = OpenAIServingError.from_exception(exc)
            response.error = ResponseError(message=error.message)
        finally:
            entry.task = None


def _check_modes(request: ResponsesRequest, response: ResponsesResponse) -> None:
    if request.background and not response.store:
        raise OpenAIServingError(
            "background needs store=true (and a server whose store keeps responses: "
            "--responses-store-max-entries > 0)",
            param="background",
        )
    if request.background and request.stream:
        raise OpenAIServingError(
            "background with stream=true is not supported; send one of them", param="stream"
        )


def _chat_request_of(
    request: ResponsesRequest, conversation: list[dict[str, Any]], extensions: dict[str, Any]
) -> ChatCompletionRequest:
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    return chat_request(
        extensions,
        model=request.model,
        messages=[*system, *conversation],
        max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=chat_tools(request),
        tool_choice=chat_tool_choice(request),
        parallel_tool_calls=request.parallel_tool_calls,
        response_format=response_format(request),
        stream=request.stream,
        priority=request.priority,
        user=request.user,
    )


def _response_of(request: ResponsesRequest, model: str, can_store: bool) -> ResponsesResponse:
    """The response object, echoing the request's settings, before any output."""
    text = request.text.model_dump(by_alias=True, exclude_none=True) if request.text else None
    choice = request.tool_choice
    return ResponsesResponse(
        model=model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=request.tools or [],
        tool_choice=choice.model_dump() if hasattr(choice, "model_dump") else choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls,
        text=text or {"format": {"type": "text"}},
        reasoning=request.reasoning.model_dump(exclude_none=True) if request.reasoning else None,
        previous_response_id=request.previous_response_id,
        store=request.store and can_store,
        background=request.background,
        metadata=request.metadata,
        user=request.user,
    )


def _block_of(item: Any) -> Block:
    """The block an output item came from (for the stored conversation)."""
    if item.type == "function_call":
        return Block("tool_call", item.arguments, item.call_id, item.name)
    if item.type == "reasoning":
        return Block("reasoning", "".join(part.text for part in item.content))
    return Block("text", "".join(part.text for part in item.content))
