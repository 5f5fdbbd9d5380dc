"""Other APIs on top of chat completions: /v1/responses and /v1/messages translate their
request into a `ChatCompletionRequest`, run it through `OpenAIServingChat` (the same
template rendering, sampling, structured outputs, tool-call and reasoning parsing as
/v1/chat/completions) and translate the answer back.

What they translate back is a list of content *blocks*, the shape both APIs share:
the reasoning, the text, then each tool call (Responses calls them output items,
Anthropic content blocks).  A whole answer becomes blocks with `blocks_of`; a stream
becomes `BlockStart` / `BlockDelta` / `BlockStop` events and one closing `Finish`
with `block_events`.

`reasoning_of` is the one place where the reasoning text is read from the chat
answer (a message, or a stream delta).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    StreamOptions,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError
from minivllm.entrypoints.openai.sse_stream import SSE_DONE

BlockKind = Literal["reasoning", "text", "tool_call"]

REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where the chat answer carries the reasoning parser's text (vLLM's field, then its
older alias)."""


def reasoning_of(message: Any) -> str | None:
    """The reasoning text of a chat message or stream delta (None when the server runs
    no reasoning parser, or the model did not think)."""
    for name in REASONING_FIELDS:
        value = getattr(message, name, None)
        if value is None and message.model_extra:
            value = message.model_extra.get(name)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass
class Block:
    """One content block of an answer."""

    kind: BlockKind
    text: str = ""
    """The reasoning or text, or a tool call's arguments (JSON text)."""
    call_id: str | None = None
    name: str | None = None


@dataclass
class Finish:
    """How the answer ended, and its token counts."""

    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int


def blocks_of(response: ChatCompletionResponse) -> tuple[list[Block], Finish]:
    """The blocks of a whole chat answer (its first choice), and how it ended."""
    choice = response.choices[0]
    message = choice.message
    blocks = []
    reasoning = reasoning_of(message)
    if reasoning:
        blocks.append(Block("reasoning", reasoning))
    if message.content:
        blocks.append(Block("text", message.content))
    for call in message.tool_calls:
        blocks.append(Block("tool_call", call.function.arguments, call.id, call.function.name))
    usage = response.usage
    finish = Finish(
        choice.finish_reason,
        choice.stop_reason,
        usage.prompt_tokens,
        usage.completion_tokens or 0,
    )
    return blocks, finish


@dataclass
class BlockStart:
    """A block begins (a tool call's id and name are known from its start)."""

    index: int
    block: Block


@dataclass
class BlockDelta:
    """More text of the open block."""

    index: int
    text: str


@dataclass
class BlockStop:
    """The block is complete (``block.text`` holds all of it)."""

    index: int
    block: Block


@dataclass
class Usage:
    """The token counts so far (the prompt's is known from the stream's first chunk)."""

    num_prompt_tokens: int
    num_output_tokens: int


BlockEvent = BlockStart | BlockDelta | BlockStop | Usage | Finish


NOT_FORWARDED = frozenset({
    "model", "messages", "n", "stream", "stream_options", "tools", "tool_choice",
    "logprobs", "top_logprobs", "prompt_logprobs", "echo", "add_generation_prompt",
    "continue_final_message",
})  # fmt: skip
"""Chat fields the translation owns (or that answers of one choice without logprobs
cannot carry): never taken from a request's extra fields."""


def chat_extensions(request: BaseModel) -> dict[str, Any]:
    """vLLM's chat extensions sent with a Responses or Messages request (``top_k``,
    ``min_p``, ``seed``, ``structured_outputs``, ``chat_template_kwargs``, ...): its
    extra fields that a chat request knows, taken out of its extras (so they are not
    reported as unknown)."""
    extra = request.model_extra or {}
    known = ChatCompletionRequest.model_fields
    names = [name for name in extra if name in known and name not in NOT_FORWARDED]
    return {name: extra.pop(name) for name in names}


def chat_request(extensions: dict[str, Any], **fields: Any) -> ChatCompletionRequest:
    """A chat request for the translated ``fields`` (which win over the client's
    ``extensions``); a stream reports its token counts on every chunk, since both
    APIs need the prompt's count at their stream's start."""
    fields = {**extensions, **{k: v for k, v in fields.items() if v is not None}}
    try:
        request = ChatCompletionRequest(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise OpenAIServingError(f"{where}: {error['msg']}", param=where) from None
    if request.stream:
        request.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    return request


async def run_chat(
    chat: OpenAIServingChat, request: ChatCompletionRequest
) -> ChatCompletionResponse | AsyncIterator[ChatCompletionStreamResponse]:
    """The chat answer: whole, or (``request.stream``) its chunks.  A request the
    server refuses raises `OpenAIServingError` here, before any chunk."""
    result = await chat.create_chat_completion(request)
    if isinstance(result, ChatCompletionResponse):
        return result
    return _chunks(result)


async def _chunks(events: AsyncIterator[str]) -> AsyncIterator[ChatCompletionStreamResponse]:
    """The chat stream's chunks, read back from its server-sent events; an error event
    is raised as `OpenAIServingError`."""
    try:
        async for event in events:
            if event == SSE_DONE or not event.startswith("data: "):
                continue
            body = json.loads(event[len("data: ") :])
            if "error" in body:
                error = body["error"]
                raise OpenAIServingError(str(error.get("message", "the stream failed")))
            yield ChatCompletionStreamResponse.model_validate(body)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


@dataclass
class _Assembler:
    """Turns chat stream deltas into block events."""

    blocks: list[Block] = field(default_factory=list)
    open: bool = False
    calls: dict[int, int] = field(default_factory=dict)
    """Tool call index in the chat stream -> its block's index."""

    def close(self) -> list[BlockEvent]:
        if not self.open:
            return []
        self.open = False
        return [BlockStop(len(self.blocks) - 1, self.blocks[-1])]

    def _start(self, block: Block) -> list[BlockEvent]:
        events = self.close()
        self.blocks.append(block)
        self.open = True
        # A copy: the block grows as deltas come, its start event shows it empty.
        return [*events, BlockStart(len(self.blocks) - 1, replace(block))]

    def text(self, kind: BlockKind, text: str) -> list[BlockEvent]:
        if not text:
            return []
        events: list[BlockEvent] = []
        if not (self.open and self.blocks[-1].kind == kind):
            events += self._start(Block(kind))
        self.blocks[-1].text += text
        return [*events, BlockDelta(len(self.blocks) - 1, text)]

    def tool_call(self, delta: Any) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        if delta.index not in self.calls:
            name = delta.function.name if delta.function else None
            events += self._start(Block("tool_call", call_id=delta.id, name=name))
            self.calls[delta.index] = len(self.blocks) - 1
        index = self.calls[delta.index]
        arguments = delta.function.arguments if delta.function else None
        if arguments:
            self.blocks[index].text += arguments
            events.append(BlockDelta(index, arguments))
        return events

    def feed(self, delta: Any) -> list[BlockEvent]:
        events = self.text("reasoning", reasoning_of(delta) or "")
        events += self.text("text", delta.content or "")
        for call in delta.tool_calls or []:
            events += self.tool_call(call)
        return events


async def block_events(
    chunks: AsyncIterator[ChatCompletionStreamResponse],
) -> AsyncIterator[BlockEvent]:
    """The stream as block events: `Usage` first (the prompt's token count), then each
    block's start, deltas and stop, and `Finish` last."""
    assembler = _Assembler()
    finish = Finish(None, None, 0, 0)
    usage: Usage | None = None
    async for chunk in chunks:
        if chunk.usage is not None:
            finish.num_prompt_tokens = chunk.usage.prompt_tokens
            finish.num_output_tokens = chunk.usage.completion_tokens or 0
            if usage is None:
                usage = Usage(finish.num_prompt_tokens, finish.num_output_tokens)
                yield usage
        for choice in chunk.choices:
            for event in assembler.feed(choice.delta):
                yield event
            if choice.finish_reason is not None:
                finish.finish_reason = choice.finish_reason
                finish.stop_reason = choice.stop_reason
    for event in assembler.close():
        yield event
    yield finish
