"""The event stream of a ``stream: true`` response.

``response.created`` and ``response.in_progress`` open it; each output item then has
``response.output_item.added``, its content part (``response.content_part.added``),
its deltas (``response.output_text.delta``, ``response.reasoning_text.delta`` or
``response.function_call_arguments.delta``), the matching ``.done`` events and
``response.output_item.done``; ``response.completed`` (``response.incomplete`` when
max_output_tokens cut it short, ``response.failed`` on an error) ends it.  Every
event carries its ``sequence_number``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from minivllm.entrypoints.openai.chat_bridge import (
    Block,
    BlockDelta,
    BlockEvent,
    BlockStart,
    BlockStop,
    Finish,
)
from minivllm.entrypoints.openai.responses.protocol import (
    OutputItem,
    OutputText,
    ReasoningText,
    ResponseError,
    ResponsesResponse,
)
from minivllm.entrypoints.openai.responses.translate import output_item
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

_DELTA_EVENTS = {
    "text": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "tool_call": "response.function_call_arguments.delta",
}
_END_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete"}


def _part(block: Block) -> dict[str, Any] | None:
    """The content part of a text or reasoning item (a tool call has none)."""
    if block.kind == "text":
        return OutputText(text=block.text).model_dump()
    if block.kind == "reasoning":
        return ReasoningText(text=block.text).model_dump()
    return None


class ResponseStream:
    """Writes one response's events."""

    def __init__(self, response: ResponsesResponse) -> None:
        self.response = response
        self.items: dict[int, OutputItem] = {}
        self._numbers = itertools.count()

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": next(self._numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _snapshot(self) -> dict[str, Any]:
        return self.response.model_dump(mode="json")

    def _at(self, index: int) -> dict[str, Any]:
        return {"item_id": self.items[index].id, "output_index": index}

    def start(self) -> list[str]:
        return [
            self.event("response.created", response=self._snapshot()),
            self.event("response.in_progress", response=self._snapshot()),
        ]

    def on(self, event: BlockEvent) -> list[str]:
        """The events of one block event."""
        if isinstance(event, BlockStart):
            item = self.items[event.index] = output_item(event.block, "in_progress")
            out = [self.event("response.output_item.added", output_index=event.index,
                              item=item.model_dump())]  # fmt: skip
            part = _part(event.block)
            if part is not None:
                out.append(self.event("response.content_part.added", **self._at(event.index),
                                      content_index=0, part=part))  # fmt: skip
            return out
        if isinstance(event, BlockDelta):
            block_kind = _kind_of(self.items[event.index])
            extra: dict[str, Any] = {"content_index": 0} if block_kind != "tool_call" else {}
            if block_kind == "text":
                extra["logprobs"] = []
            return [self.event(_DELTA_EVENTS[block_kind], **self._at(event.index),
                               delta=event.text, **extra)]  # fmt: skip
        if isinstance(event, BlockStop):
            return self._stop(event)
        return []

    def _stop(self, event: BlockStop) -> list[str]:
        block, at = event.block, self._at(event.index)
        item = self.items[event.index] = output_item(block, item_id=at["item_id"])
        part = _part(block)
        if block.kind == "text":
            out = [self.event("response.output_text.done", **at, content_index=0,
                              text=block.text, logprobs=[])]  # fmt: skip
        elif block.kind == "reasoning":
            out = [self.event("response.reasoning_text.done", **at, content_index=0,
                              text=block.text)]  # fmt: skip
        else:
            out = [self.event("response.function_call_arguments.done", **at,
                              name=block.name, arguments=block.text)]  # fmt: skip
        if part is not None:
            out.append(self.event("response.content_part.done", **at, content_index=0, part=part))
        out.append(self.event("response.output_item.done", output_index=event.index,
                              item=item.model_dump()))  # fmt: skip
        return out

    def end(self, finish: Finish, close: Callable[[Finish], None]) -> str:
        """The closing event, once ``close`` has set the response's status and usage."""
        self.response.output = [self.items[i] for i in sorted(self.items)]
        close(finish)
        kind = _END_EVENTS.get(self.response.status, "response.completed")
        return self.event(kind, response=self._snapshot())

    def fail(self, exc: Exception) -> str:
        error = OpenAIServingError.from_exception(exc)
        self.response.status = "failed"
        self.response.error = ResponseError(message=error.message)
        self.response.output = [self.items[i] for i in sorted(self.items)]
        return self.event("response.failed", response=self._snapshot())


def _kind_of(item: OutputItem) -> str:
    return {"message": "text", "reasoning": "reasoning"}.get(item.type, "tool_call")


async def response_events(
    stream: ResponseStream,
    events: AsyncIterator[BlockEvent],
    close: Callable[[Finish], None],
) -> AsyncIterator[str]:
    """The whole event stream of a response (``close`` completes the response object
    when the answer has ended: status, usage, store)."""
    for line in stream.start():
        yield line
    try:
        async for event in events:
            if isinstance(event, Finish):
                yield stream.end(event, close)
                return
            for line in stream.on(event):
                yield line
    except Exception as exc:
        yield stream.fail(exc)
    finally:
        if stream.response.status == "in_progress":  # the client left: aborted
            stream.response.status = "cancelled"
