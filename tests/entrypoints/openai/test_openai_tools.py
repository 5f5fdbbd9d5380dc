"""Tool calling through the server with the official `openai` client: a named function,
``required`` and ``auto`` (the server runs ``--enable-auto-tool-choice --tool-call-parser
hermes``), streaming and not, and tool results going back through the chat template.

The default model's own template shows no tools, and the model is too small to decide
to call one; for ``auto`` the tests make it write a hermes tool call with a regex
constraint, so what is tested is the parser and the response, not the model's choice.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
from server_utils import API_KEY, MODEL_NAME

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}},
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
HERMES_CALL = (
    r'Now\. <tool_call>\{"name": "get_time", "arguments": \{"zone": "(UTC|CET)"\}\}</tool_call>'
)

"""A regex that makes the model answer with a hermes tool call after some content."""


def _create(client, messages=MESSAGES, **kwargs):  # noqa: ANN001, ANN202, B006
    kwargs.setdefault("max_tokens", 80)
    return client.chat.completions.create(
        model=MODEL_NAME, messages=messages, tools=TOOLS, temperature=0, **kwargs
    )


def _check_calls(calls) -> None:  # noqa: ANN001
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def _collect(stream) -> tuple[str, dict[int, dict[str, str]], str | None]:  # noqa: ANN001
    """Content, calls by index (id, name, arguments joined) and the finish reason."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                assert not call["id"], "the id comes once, in the call's first delta"
                call["id"] = delta.id
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_named_function_round_trip(client, server, tokenizer) -> None:  # noqa: ANN001
    resp = _create(client, tool_choice=NAMED)
    message = resp.choices[0].message
    assert message.content is None and resp.choices[0].finish_reason == "stop"
    _check_calls(message.tool_calls)
    [call] = message.tool_calls
    assert call.function.name == "get_weather"

    # The call and its result go back through the chat template; the model answers.
    history = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"},
    ]
    resp = _create(client, messages=history, tool_choice="none", max_tokens=8)
    assert resp.choices[0].message.content and not resp.choices[0].message.tool_calls
    rendered = httpx.post(
        f"{server.url}/tokenize",
        json={"model": MODEL_NAME, "messages": history},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()["tokens"]
    assert "21 degrees and sunny" in tokenizer.decode(rendered)


def test_named_function_streams_its_arguments(client) -> None:  # noqa: ANN001
    content, calls, finish = _collect(_create(client, tool_choice=NAMED, stream=True))
    assert content == "" and finish == "stop" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_PARAMS)


def test_required_calls_tools_streaming_and_not(client) -> None:  # noqa: ANN001
    resp = _create(client, tool_choice="required", parallel_tool_calls=False)
    assert resp.choices[0].finish_reason == "tool_calls"
    _check_calls(resp.choices[0].message.tool_calls)
    assert len(resp.choices[0].message.tool_calls) == 1
    stream = _create(client, tool_choice="required", parallel_tool_calls=False, stream=True)
    _, calls, finish = _collect(stream)
    assert finish == "tool_calls" and list(calls) == [0]
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])


def test_auto_tool_choice_parses_hermes_calls(client) -> None:  # noqa: ANN001
    forced = {"structured_outputs": {"regex": HERMES_CALL}}
    resp = _create(client, extra_body=forced)
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert message.content == "Now."
    _check_calls(message.tool_calls)
    content, calls, finish = _collect(_create(client, extra_body=forced, stream=True))
    # The content before the call streams as content; the call comes whole at the end.
    assert content.strip() == "Now." and finish == "tool_calls"
    assert calls[0]["name"] == "get_time" and calls[0]["id"].startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME_PARAMS)
    # No call in the text: a plain answer.
    plain = {"structured_outputs": {"regex": "It is sunny( today)?\\."}}
    resp = _create(client, extra_body=plain)
    assert resp.choices[0].finish_reason == "stop" and not resp.choices[0].message.tool_calls
    assert resp.choices[0].message.content.startswith("It is sunny")


def test_bad_tool_choices_get_a_400(server) -> None:  # noqa: ANN001
    def post(**body) -> httpx.Response:  # noqa: ANN003
        return httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 3, **body},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )

    resp = post(tool_choice={"type": "function", "function": {"name": "nope"}})
    assert resp.status_code == 400 and "nope" in resp.json()["error"]["message"]
    resp = post(tool_choice="required", response_format={"type": "json_object"})
    assert resp.status_code == 400 and "tool_choice" in resp.json()["error"]["message"]
