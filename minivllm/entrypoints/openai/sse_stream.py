"""What the chat and completion streams share: server-sent events, the usage they
report (``stream_options``), and the frame of every stream (an error becomes an error
event, and ``data: [DONE]`` always ends it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from minivllm.entrypoints.openai.protocol import StreamOptions, UsageInfo
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError, usage_of

SSE_DONE = "data: [DONE]\n\n"
"""The event that ends every stream."""


def sse(chunk: BaseModel | dict[str, Any]) -> str:
    """One server-sent event carrying ``chunk`` as JSON."""
    if isinstance(chunk, BaseModel):
        body = chunk.model_dump_json(exclude_unset=True)
    else:
        body = json.dumps(chunk)
    return f"data: {body}\n\n"


def sse_error(exc: BaseException) -> str:
    """An error in the middle of a stream (the HTTP status is already sent)."""
    return sse(OpenAIServingError.from_exception(exc).to_response())


@dataclass
class StreamUsage:
    """A stream's token counts and the usage its chunks report: none unless
    ``include_usage``; then null on every chunk (or the running totals with
    ``continuous_usage_stats``) and a closing chunk with the totals."""

    num_prompt_tokens: int
    num_tokens: list[int]
    """Completion tokens so far, per choice."""
    include: bool = False
    continuous: bool = False

    @classmethod
    def of(
        cls, opts: StreamOptions | None, num_prompt_tokens: int, num_choices: int
    ) -> StreamUsage:
        include = bool(opts and opts.include_usage)
        # Continuous stats only count when usage is included at all.
        continuous = bool(include and opts and opts.continuous_usage_stats)
        return cls(num_prompt_tokens, [0] * num_choices, include, continuous)

    def totals(self) -> UsageInfo:
        return usage_of(self.num_prompt_tokens, sum(self.num_tokens))

    def stamp(self, chunk: Any) -> Any:
        """``chunk`` with its ``usage`` set as the options ask."""
        if self.include:
            chunk.usage = self.totals() if self.continuous else None
        return chunk

    def closing(self, chunk_cls: type[BaseModel], request_id: str, created: int, model: str) -> str:
        """The closing usage event (a chunk with no choices), or "" without usage."""
        if not self.include:
            return ""
        usage = self.totals()
        return sse(chunk_cls(id=request_id, created=created, model=model, choices=[], usage=usage))


async def framed(events: AsyncIterator[str], closing: Callable[[], str]) -> AsyncIterator[str]:
    """The frame of a stream: ``events``, then ``closing()`` (if not empty); an error on
    the way becomes an error event; [DONE] always ends it."""
    try:
        async for event in events:
            yield event
        last = closing()
        if last:
            yield last
    except Exception as exc:
        yield sse_error(exc)
    yield SSE_DONE
