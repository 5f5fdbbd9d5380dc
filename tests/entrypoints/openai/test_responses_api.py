"""/v1/responses through the shared server with the official `openai` client: every body
and stream event is validated against the client's own types, and each answer is
checked against /v1/chat/completions given the same conversation (greedy, so the
two must agree token for token).

The tool round trip forces the call with a named ``tool_choice`` (the arguments are
constrained to the function's JSON schema), as the chat tool tests do.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from server_utils import API_KEY, MODEL_NAME

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS}
NAMED = {"type": "function", "name": "get_weather"}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 8}
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


def _create(client: openai.OpenAI, **kwargs: Any) -> Response:
    """A response, its raw JSON validated against the client's `Response` type."""
    raw = client.responses.with_raw_response.create(model=MODEL_NAME, **{**GREEDY, **kwargs})
    return Response.model_validate(raw.http_response.json())


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int = 8) -> Any:
    return client.chat.completions.create(
        model=MODEL_NAME, messages=messages, temperature=0, max_tokens=max_tokens
    )


def test_plain_response_matches_chat_completions(client) -> None:  # noqa: ANN001
    resp = _create(client, input="Name a colour.", instructions="Answer in one word.")
    chat = _chat(client, [{"role": "system", "content": "Answer in one word."},
                          {"role": "user", "content": "Name a colour."}])  # fmt: skip
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    expected = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert resp.status == expected and resp.instructions == "Answer in one word."
    # Stored by default: GET gives it back.
    again = client.responses.retrieve(resp.id)
    assert again.output_text == resp.output_text and again.status == resp.status


def test_streamed_response_events(client) -> None:  # noqa: ANN001
    whole = _create(client, input="Say hello.")
    events = list(client.responses.create(model=MODEL_NAME, input="Say hello.", stream=True,
                                          **GREEDY))  # fmt: skip
    for event in events:
        STREAM_EVENT.validate_python(event.to_dict())
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = Response.model_validate(events[-1].response.to_dict())
    assert final.output_text == text and final.usage.output_tokens == whole.usage.output_tokens
    # A streamed response is stored whole once it has ended, with the ids streamed.
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == text and stored.output[0].id == events[2].item.id


def test_function_tool_round_trip(client) -> None:  # noqa: ANN001
    first = _create(client, input="What is the weather in Paris?", tools=[TOOL],
                    tool_choice=NAMED, max_output_tokens=40)  # fmt: skip
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}

    # Continued from the store, or with the whole conversation sent again: one prompt.
    stored = _create(client, previous_response_id=first.id, input=[result], tools=[TOOL],
                     tool_choice="none")  # fmt: skip
    replay = [{"role": "user", "content": "What is the weather in Paris?"},
              call.model_dump(exclude_none=True), result]  # fmt: skip
    stateless = _create(client, input=replay, tools=[TOOL], tool_choice="none", store=False)
    assert stored.usage.input_tokens == stateless.usage.input_tokens
    assert stored.output_text == stateless.output_text and stored.output_text
    chat = _chat(client, [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C, sunny"},
    ])  # fmt: skip
    assert stateless.output_text == chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stateless.id)  # store=False: not kept


def test_function_call_streams_its_arguments(client) -> None:  # noqa: ANN001
    events = list(client.responses.create(
        model=MODEL_NAME, input="Weather in Rome?", tools=[TOOL], tool_choice=NAMED,
        stream=True, temperature=0, max_output_tokens=40))  # fmt: skip
    for event in events:
        STREAM_EVENT.validate_python(event.to_dict())
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMS)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == done.arguments


def test_previous_response_id_continues_the_conversation(client) -> None:  # noqa: ANN001
    first = _create(client, input="My name is Ada.", instructions="Be brief.")
    second = _create(client, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The instructions are not carried over; the turns are.
    chat = _chat(client, [{"role": "user", "content": "My name is Ada."},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "What is my name?"}])  # fmt: skip
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content


def test_json_schema_text_format(client) -> None:  # noqa: ANN001
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}  # fmt: skip
    resp = _create(
        client,
        input="Pick a colour as JSON.",
        max_output_tokens=30,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema}},
    )
    jsonschema.validate(json.loads(resp.output_text), schema)
    assert resp.text.format.type == "json_schema"
    # vLLM's chat extensions ride along as extra fields.
    picked = _create(client, input="Pick a colour.",
                     extra_body={"structured_outputs": {"choice": ["red", "blue"]}})  # fmt: skip
    assert picked.output_text in ("red", "blue")


def test_unknown_previous_response_is_404(client) -> None:  # noqa: ANN001
    with pytest.raises(openai.NotFoundError, match="resp-nope"):
        _create(client, input="Hi", previous_response_id="resp-nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp-nope")


def test_unsupported_item_type_is_400_naming_it(client) -> None:  # noqa: ANN001
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, input=[{"type": "computer_call_output", "call_id": "c", "output": {}}])
    assert "computer_call_output" in info.value.message
    assert info.value.body["param"] == "input.0"
    with pytest.raises(openai.BadRequestError, match="web_search"):
        _create(client, input="Hi", tools=[{"type": "web_search"}])


def test_background_response_can_be_cancelled(client, server) -> None:  # noqa: ANN001
    queued = _create(client, input="Write a long story.", background=True,
                     max_output_tokens=1000, temperature=1)  # fmt: skip
    assert queued.status in ("queued", "in_progress") and queued.background
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    Response.model_validate(
        httpx.get(f"{server.url}/v1/responses/{queued.id}",
                  headers={"Authorization": f"Bearer {API_KEY}"}).json()
    )  # fmt: skip
    assert client.responses.retrieve(queued.id).status == "cancelled"
    done = _create(client, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(done.id)
