"""/v1/messages and /v1/messages/count_tokens through the shared server with the official
`anthropic` client: bodies and stream events are validated against the client's own
types, and answers are checked against /v1/chat/completions given the same
conversation (greedy).  The tool round trip forces the call with ``tool_choice``
``{"type": "tool"}`` (the input constrained to the tool's schema)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter
from server_utils import API_KEY, MODEL_NAME

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
TOOL = {"name": "get_weather", "description": "The weather", "input_schema": WEATHER_SCHEMA}
QUESTION = [{"role": "user", "content": "Name a colour."}]
SYSTEM = "Answer in one word."
GREEDY = {"extra_body": {"temperature": 0}}
"""This client version has no temperature argument; the server reads the field."""
STREAM_EVENT = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
def claude(server):  # noqa: ANN001, ANN201
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def _create(claude: anthropic.Anthropic, **kwargs: Any) -> Message:
    """A message, its raw JSON validated against the client's `Message` type."""
    kwargs = {"model": MODEL_NAME, "max_tokens": 12, "messages": QUESTION, **GREEDY, **kwargs}
    raw = claude.messages.with_raw_response.create(**kwargs)
    return Message.model_validate(raw.http_response.json())


def _chat(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=MODEL_NAME, messages=messages, temperature=0, **kwargs
    )


def test_plain_message_matches_chat_completions(claude, client) -> None:  # noqa: ANN001
    message = _create(claude, system=SYSTEM)
    chat = _chat(client, [{"role": "system", "content": SYSTEM}, *QUESTION])
    [block] = message.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    finish = chat.choices[0].finish_reason
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[finish]
    counted = claude.messages.count_tokens(model=MODEL_NAME, system=SYSTEM, messages=QUESTION)
    MessageTokensCount.model_validate(counted.to_dict())
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_assistant_prefill_is_continued(claude, client) -> None:  # noqa: ANN001
    prefill = [*QUESTION, {"role": "assistant", "content": "My answer is"}]
    message = _create(claude, messages=prefill, max_tokens=6)
    chat = _chat(client, prefill, max_tokens=6,
                 extra_body={"continue_final_message": True, "add_generation_prompt": False})  # fmt: skip
    assert message.content[0].text == chat.choices[0].message.content


def test_stop_sequence(claude) -> None:  # noqa: ANN001
    text = _create(claude).content[0].text
    word = text.split()[1]
    message = _create(claude, stop_sequences=[word])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == word
    assert message.content[0].text == text[: text.index(word)]


def test_streamed_message_events(claude) -> None:  # noqa: ANN001
    whole = _create(claude, system=SYSTEM)
    with claude.messages.stream(model=MODEL_NAME, max_tokens=12, messages=QUESTION,
                                system=SYSTEM, **GREEDY) as stream:  # fmt: skip
        raw = [event for event in stream if event.type in RAW_TYPES]
        final = stream.get_final_message()
    for event in raw:
        STREAM_EVENT.validate_python(event.to_dict())
    kinds = [e.type for e in raw]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in raw if e.type == "content_block_delta")
    assert text == whole.content[0].text == final.content[0].text
    assert raw[0].message.usage.input_tokens == whole.usage.input_tokens
    delta = raw[-2]
    assert delta.delta.stop_reason == whole.stop_reason
    assert delta.usage.output_tokens == whole.usage.output_tokens


RAW_TYPES = {"message_start", "content_block_start", "content_block_delta",
             "content_block_stop", "message_delta", "message_stop"}  # fmt: skip


def test_tool_round_trip(claude, client, server) -> None:  # noqa: ANN001
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = _create(claude, messages=question, tools=[TOOL], max_tokens=40,
                    tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    [use] = first.content
    assert use.type == "tool_use" and use.name == "get_weather"
    assert first.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER_SCHEMA)

    history = [*question, {"role": "assistant", "content": [use.to_dict()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "21 C, sunny"}]}]  # fmt: skip
    answer = _create(claude, messages=history, tools=[TOOL], tool_choice={"type": "none"})
    chat = _chat(client, [
        *question,
        {"role": "assistant", "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "21 C, sunny"},
    ])  # fmt: skip
    assert answer.content[0].text == chat.choices[0].message.content
    assert answer.usage.input_tokens == chat.usage.prompt_tokens


def test_tool_use_streams_input_json(claude) -> None:  # noqa: ANN001
    with claude.messages.stream(model=MODEL_NAME, max_tokens=40, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather in Rome?"}],
                                **GREEDY) as stream:  # fmt: skip
        raw = [e for e in stream if e.type in RAW_TYPES]
        final = stream.get_final_message()
    for event in raw:
        STREAM_EVENT.validate_python(event.to_dict())
    partial = "".join(e.delta.partial_json for e in raw if e.type == "content_block_delta")
    jsonschema.validate(json.loads(partial), WEATHER_SCHEMA)
    assert raw[1].content_block.type == "tool_use" and raw[1].content_block.input == {}
    assert final.content[0].input == json.loads(partial)
    assert final.stop_reason == "tool_use"


def test_errors_have_anthropics_shape(claude, server) -> None:  # noqa: ANN001
    image = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as info:
        _create(claude, messages=image)
    assert info.value.body["type"] == "error" and "'image'" in info.value.message
    assert info.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        _create(claude, model="no-such-model")
    url = f"{server.url}/v1/messages"
    body = {"model": MODEL_NAME, "messages": QUESTION}  # no max_tokens
    for headers, status, kind in [
        ({"x-api-key": "wrong"}, 401, "authentication_error"),
        ({"x-api-key": API_KEY}, 400, "invalid_request_error"),
    ]:
        resp = httpx.post(url, json=body, headers=headers)
        assert resp.status_code == status
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == kind
