"""Structured outputs through the server with the official `openai` client:
``response_format`` (json_schema, json_object, a pydantic model via
``beta.chat.completions.parse``), vLLM's ``structured_outputs`` and ``guided_*`` fields,
and a 400 naming the problem for an invalid schema, regex or grammar."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field
from server_utils import API_KEY, MODEL_NAME

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 15},
            "population": {"type": "integer", "minimum": 0, "maximum": 50000000},
        },
        "required": ["city", "population"],
    },
    {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
            "nested": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            },
        },
        "required": ["colors", "nested"],
    },
]


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def _chat(client, content: str, **kwargs):  # noqa: ANN001, ANN202
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=kwargs.pop("max_tokens", 80),
        **kwargs,
    )


def test_json_schema_and_json_object_response_formats(client) -> None:  # noqa: ANN001
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMAS[0]}}
    resp = _chat(client, "Answer in JSON.", response_format=fmt)
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMAS[0])
    # (A prompt the tiny model answers with a short object: any JSON may run on.)
    resp = _chat(
        client, "Describe a cat as a JSON object.", response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(resp.choices[0].message.content), dict)
    # Streamed, the pieces add up to a valid document as well.
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMAS[1]}}
    stream = _chat(client, "Answer in JSON.", response_format=fmt, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[1])


def test_beta_parse_returns_the_pydantic_model(client) -> None:  # noqa: ANN001
    resp = client.beta.chat.completions.parse(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=Person,
        temperature=0,
        max_tokens=80,
    )
    person = resp.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_vllm_fields_regex_choice_and_grammar(client) -> None:  # noqa: ANN001
    regex = r"[0-9]{3}-[0-9]{4}"
    resp = client.completions.create(
        model=MODEL_NAME, prompt="Call me at", max_tokens=20, n=2, temperature=1.0, seed=1,
        extra_body={"structured_outputs": {"regex": regex}},
    )  # fmt: skip
    assert all(re.fullmatch(regex, c.text) for c in resp.choices), resp.choices
    choices = ["positive", "negative"]
    resp = _chat(client, "Is this good?", extra_body={"guided_choice": choices})
    assert resp.choices[0].message.content in choices
    resp = client.completions.create(
        model=MODEL_NAME, prompt="Sum:", max_tokens=20, temperature=0,
        extra_body={"guided_grammar": 'root ::= [1-9] " + " [1-9] " = " [0-9]+'},
    )  # fmt: skip
    assert re.fullmatch(r"[1-9] \+ [1-9] = [0-9]+", resp.choices[0].text)
    resp = _chat(client, "JSON:", extra_body={"guided_json": SCHEMAS[0]})
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMAS[0])


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"guided_regex": "[a-"}, "invalid regex"),
        ({"structured_outputs": {"json": {"type": "nonsense"}}}, "invalid JSON schema"),
        ({"guided_json": "{not json"}, "not valid JSON"),
        ({"structured_outputs": {"grammar": 'root ::= "a" |'}}, "invalid grammar"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "one output constraint"),
        ({"structured_outputs": {"jsn": {}}}, "unknown structured_outputs field"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ],
)
def test_invalid_constraints_get_a_400(server, client, body, words) -> None:  # noqa: ANN001
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **body},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert words in error["message"] and error["code"] == 400
    # The server is unharmed.
    assert _chat(client, "hi", max_tokens=2).choices[0].finish_reason == "length"
