"""The translations behind /v1/responses and /v1/messages, without a server: chat
answers (with reasoning, text and tool calls) into Responses output items and stream
events and into Anthropic content blocks and stream events, each validated against the
official clients' own types; input items into chat messages; the bounded store."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from minivllm.entrypoints.cli.main import main
from minivllm.entrypoints.openai.anthropic.protocol import MessagesRequest
from minivllm.entrypoints.openai.anthropic.serving import _message_events
from minivllm.entrypoints.openai.anthropic.translate import chat_messages, content_block
from minivllm.entrypoints.openai.chat_bridge import block_events, blocks_of
from minivllm.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
)
from minivllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from minivllm.entrypoints.openai.responses.store import ResponseStore, StoredResponse, StoreLimits
from minivllm.entrypoints.openai.responses.stream import ResponseStream, response_events
from minivllm.entrypoints.openai.responses.translate import (
    end_status,
    input_messages,
    output_items,
    usage_of,
)
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

CALL = {"id": "call-1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip


def _chat_answer(**message: Any) -> ChatCompletionResponse:
    return ChatCompletionResponse.model_validate({
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    })  # fmt: skip


def _chunk(delta: dict[str, Any] | None, finish: str | None = None) -> ChatCompletionStreamResponse:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return ChatCompletionStreamResponse.model_validate({
        "id": "c", "created": 0, "model": "m", "choices": choices,
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    })  # fmt: skip


# A stream with every kind of block: reasoning, text, a tool call in two pieces.
CHUNKS = [
    {"role": "assistant", "content": ""},
    {"reasoning": "Let me "},
    {"reasoning": "think."},
    {"content": "Calling."},
    {"tool_calls": [{"index": 0, "id": "call-1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
]  # fmt: skip


async def _stream_chunks():  # noqa: ANN202
    for delta in CHUNKS:
        yield _chunk(delta)
    yield _chunk({"content": ""}, finish="tool_calls")
    yield _chunk(None)


def _collect(events: Any) -> list[str]:
    async def run() -> list[str]:
        return [line async for line in events]

    return asyncio.run(run())


def _sse_bodies(lines: list[str]) -> list[dict[str, Any]]:
    bodies = []
    for line in lines:
        event, data = line.strip().split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert event == f"event: {body['type']}"
        bodies.append(body)
    return bodies


def test_whole_answer_with_reasoning_becomes_items_and_blocks() -> None:
    blocks, finish = blocks_of(_chat_answer(content="Calling.", tool_calls=[CALL],
                                            reasoning="Let me think."))  # fmt: skip
    assert [b.kind for b in blocks] == ["reasoning", "text", "tool_call"]
    response = ResponsesResponse(model="m", output=output_items(blocks), usage=usage_of(finish))
    response.status, _ = end_status(finish)  # type: ignore[assignment]
    parsed = Response.model_validate(response.model_dump(mode="json"))
    assert parsed.output[0].type == "reasoning"
    assert parsed.output[0].content[0].text == "Let me think."
    assert parsed.output_text == "Calling."
    assert parsed.output[2].call_id == "call-1" and parsed.output[2].name == "get_weather"
    message = Message.model_validate({
        "id": "msg", "type": "message", "role": "assistant", "model": "m",
        "content": [content_block(b) for b in blocks], "stop_reason": "tool_use",
        "usage": {"input_tokens": 7, "output_tokens": 5},
    })  # fmt: skip
    assert message.content[0].type == "thinking"
    assert message.content[0].thinking == "Let me think."
    assert message.content[2].input == {"city": "Paris"}


def test_responses_stream_events_follow_the_sequence() -> None:
    response = ResponsesResponse(model="m")
    closed = []
    lines = _collect(response_events(ResponseStream(response),
                                     block_events(_stream_chunks()), closed.append))  # fmt: skip
    bodies = _sse_bodies(lines)
    adapter = TypeAdapter(ResponseStreamEvent)
    for body in bodies:
        adapter.validate_python(body)
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    kinds = [b["type"] for b in bodies]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and len(closed) == 1
    reasoning = [b["delta"] for b in bodies if b["type"] == "response.reasoning_text.delta"]
    assert "".join(reasoning) == "Let me think."
    arguments = [b for b in bodies if b["type"] == "response.function_call_arguments.done"]
    assert arguments[0]["arguments"] == '{"city": "Paris"}'
    added = [b["item"]["type"] for b in bodies if b["type"] == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    final = Response.model_validate(bodies[-1]["response"])
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    # Each item keeps the id its first event gave it.
    ids = [b["item"]["id"] for b in bodies if b["type"] == "response.output_item.added"]
    assert [item.id for item in final.output] == ids


def test_anthropic_stream_events_follow_the_sequence() -> None:
    bodies = _sse_bodies(_collect(_message_events("m", block_events(_stream_chunks()))))
    adapter = TypeAdapter(RawMessageStreamEvent)
    for body in bodies:
        adapter.validate_python(body)
    kinds = [b["type"] for b in bodies]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert bodies[0]["message"]["usage"]["input_tokens"] == 7
    starts = [b["content_block"]["type"] for b in bodies if b["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = [b["delta"] for b in bodies if b["type"] == "content_block_delta"]
    thinking = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    partial = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert thinking == "Let me think." and json.loads(partial) == {"city": "Paris"}
    assert bodies[-2]["delta"]["stop_reason"] == "tool_use"
    assert bodies[-2]["usage"]["output_tokens"] == 5
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3


def test_input_items_become_chat_messages() -> None:
    request = ResponsesRequest(input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])  # fmt: skip
    messages = input_messages(request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@pytest.mark.parametrize(
    ("item", "named"),
    [({"type": "web_search_call", "id": "ws"}, "'web_search_call'"),
     ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
      "'input_image'")],
)  # fmt: skip
def test_unsupported_input_is_a_400_naming_it(item: dict[str, Any], named: str) -> None:
    with pytest.raises(OpenAIServingError) as info:
        input_messages(ResponsesRequest(input=[item]))
    assert info.value.status == 400 and named in info.value.message


def test_anthropic_turns_become_chat_messages() -> None:
    request = MessagesRequest(max_tokens=5, system=[{"type": "text", "text": "Be brief."}],
                              messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
            {"type": "text", "text": "Thanks"}]},
    ])  # fmt: skip
    messages = chat_messages(request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["content"] is None
    assert json.loads(messages[2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "sunny"}
    image = {"role": "user", "content": [{"type": "image", "source": {}}]}
    with pytest.raises(OpenAIServingError, match="'image'"):
        chat_messages(MessagesRequest(max_tokens=5, messages=[image]))


class _Task:
    """Stands in for a background response's task."""

    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        self.cancelled = True


def _entry(response_id: str, task: Any = None) -> StoredResponse:
    return StoredResponse(ResponsesResponse(id=response_id, model="m"), [], task=task)


def test_store_evicts_the_oldest_past_its_size() -> None:
    store = ResponseStore(StoreLimits(max_entries=2, max_age_s=100))
    task = _Task()
    store.put(_entry("a", task))
    store.put(_entry("b"))
    store.put(_entry("a", task))  # replacing keeps its place (its age)
    store.put(_entry("c"))
    assert store.get("a") is None and task.cancelled
    assert store.get("b") is not None and store.get("c") is not None and len(store) == 2


def test_store_expires_by_age() -> None:
    now = [0.0]
    store = ResponseStore(StoreLimits(max_entries=10, max_age_s=60), clock=lambda: now[0])
    store.put(_entry("a"))
    now[0] = 30.0
    store.put(_entry("b"))
    now[0] = 61.0
    assert store.get("a") is None and store.get("b") is not None
    now[0] = 91.0
    assert store.get("b") is None and len(store) == 0


def test_store_limits_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--responses-store-max-entries"):
        StoreLimits(max_entries=-1)
    with pytest.raises(ValueError, match="--responses-store-max-age"):
        StoreLimits(max_age_s=0)
    store = ResponseStore(StoreLimits(max_entries=0))
    store.put(_entry("a"))
    assert not store.enabled and store.get("a") is None
    # The server flags: a bad value exits with status 2 and one line, before any load.
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--responses-store-max-entries", "-1"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--responses-store-max-entries: must be >= 0" in line
