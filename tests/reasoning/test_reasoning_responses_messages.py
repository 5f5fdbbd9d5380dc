"""The reasoning parser's split through /v1/responses (``reasoning`` output items and
``response.reasoning_text.*`` events) and /v1/messages (``thinking`` blocks and
``thinking_delta`` events), checked against /v1/chat/completions' ``reasoning`` for the
same greedy generation and validated against the official clients' own types.

The tiny random model (`reasoning_model.py`, served with ``--reasoning-parser qwen3``)
thinks for ``thinking_token_budget`` tokens, then answers from a forced choice.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from server_utils import RemoteServer

QUESTION = "Is 7 prime?"
FORCED = {"structured_outputs": {"choice": ["yes", "no"]}, "thinking_token_budget": 4}


@pytest.fixture(scope="module")
def reference(server: RemoteServer) -> tuple[str, str]:
    """(reasoning, answer) of the chat completion."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    message = client.chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_tokens=24, extra_body=FORCED).choices[0].message  # fmt: skip
    assert message.reasoning and message.content in ("yes", "no")  # type: ignore[attr-defined]
    return message.reasoning, message.content  # type: ignore[attr-defined]


def test_responses_reasoning_items(server: RemoteServer, reference: tuple[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    body = {"model": "thinker", "input": QUESTION, "temperature": 0, "max_output_tokens": 24,
            "extra_body": FORCED}  # fmt: skip
    raw = client.responses.with_raw_response.create(**body)
    resp = Response.model_validate(raw.http_response.json())
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == reference[0]
    assert resp.output_text == reference[1]
    events = list(client.responses.create(stream=True, **body))
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event.to_dict())
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    [done] = [e for e in events if e.type == "response.reasoning_text.done"]
    assert "".join(deltas) == done.text == reference[0]
    assert events[-1].response.output_text == reference[1]


def test_messages_thinking_blocks(server: RemoteServer, reference: tuple[str, str]) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    body = {"model": "thinker", "max_tokens": 24, "extra_body": {**FORCED, "temperature": 0},
            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    raw = claude.messages.with_raw_response.create(**body)
    message = Message.model_validate(raw.http_response.json())
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == reference[0]
    assert message.content[1].text == reference[1]
    with claude.messages.stream(**body) as stream:
        raw_events = [e for e in stream if e.type.startswith(("message_", "content_block_"))]
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in raw_events:
        adapter.validate_python(event.to_dict())
    thinking = "".join(
        e.delta.thinking
        for e in raw_events
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    )
    assert thinking == reference[0]
