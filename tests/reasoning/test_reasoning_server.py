"""End to end: a reasoning model served with ``--reasoning-parser qwen3``, through the
official `openai` client (its own types parse every response).

The model is tiny and random (`reasoning_model.py`), so its answers are forced: a
``thinking_token_budget`` ends the thinking after N tokens by forcing ``</think>``, and
a structured output constrains the answer only (the thinking stays free).  The raw
text of the same greedy generation, from /v1/completions, is the reference the chat
answer is split from.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from server_utils import RemoteServer

from minivllm.tokenizer import get_tokenizer

MESSAGES = [{"role": "user", "content": "Is 7 prime?"}]
CHOICE = {"structured_outputs": {"choice": ["yes", "no"]}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def chat(client: openai.OpenAI, **kwargs: object) -> ChatCompletion:
    body = {"model": "thinker", "messages": MESSAGES, "temperature": 0, "max_tokens": 24}
    return client.chat.completions.create(**{**body, **kwargs})  # type: ignore[call-overload]


def raw_text(client: openai.OpenAI, model_dir: Path, extra_body: dict) -> str:
    """The same greedy generation as plain text: the prompt rendered by the saved
    tokenizer itself, sent to /v1/completions (which parses no reasoning)."""
    tokenizer = get_tokenizer(str(model_dir))
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    out = client.completions.create(
        model="thinker", prompt=ids, temperature=0, max_tokens=24, extra_body=extra_body
    )
    return out.choices[0].text


def test_budget_ends_the_thinking_and_the_grammar_constrains_only_the_answer(
    client: openai.OpenAI, model_dir: Path
) -> None:
    extra = {**CHOICE, "thinking_token_budget": 4}
    resp = chat(client, logprobs=True, extra_body=extra)
    assert isinstance(resp, ChatCompletion)
    [choice] = resp.choices
    message = choice.message
    assert message.content in ("yes", "no")
    assert message.reasoning  # type: ignore[attr-defined]
    assert message.reasoning_content == message.reasoning  # type: ignore[attr-defined]
    # The budget counts the thinking from <think>, the template's "\n" after it too:
    # three free tokens, then the forced end marker, then the constrained answer.
    tokens = [entry.token for entry in choice.logprobs.content]  # type: ignore[union-attr]
    assert "</think>" not in tokens[:3] and tokens[3] == "</think>"
    assert "".join(tokens[:3]) == message.reasoning  # type: ignore[attr-defined]
    assert choice.finish_reason == "stop"
    # The chat answer is the raw generation, split at the marker.
    assert raw_text(client, model_dir, extra) == f"{message.reasoning}</think>{message.content}"  # type: ignore[attr-defined]


def test_streamed_reasoning_and_content_match_the_whole_answer(client: openai.OpenAI) -> None:
    extra = {**CHOICE, "thinking_token_budget": 5}
    whole = chat(client, extra_body=extra).choices[0].message
    chunks = list(chat(client, stream=True, extra_body=extra))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning", None) or "" for d in deltas)
    alias = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert reasoning == alias == whole.reasoning  # type: ignore[attr-defined]
    assert content == whole.content
    assert "</think>" not in reasoning + content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # include_reasoning=false drops the thinking, and only it.
    quiet = chat(client, extra_body={**extra, "include_reasoning": False}).choices[0].message
    assert quiet.reasoning is None and quiet.content == whole.content  # type: ignore[attr-defined]


def test_enable_thinking_false_reaches_the_template_and_all_is_content(
    client: openai.OpenAI,
) -> None:
    off = {**CHOICE, "chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, extra_body=off).choices[0].message
    # The template closed the thinking in the prompt: the grammar applies at once.
    assert message.content in ("yes", "no")
    assert message.reasoning is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_from_the_answer_after_the_reasoning(
    client: openai.OpenAI, stream: bool
) -> None:
    extra = {"structured_outputs": {"regex": TOOL_CALL.replace("{", r"\{").replace("}", r"\}")}}
    kwargs = {
        "tools": TOOLS,
        "max_tokens": 150,
        "extra_body": {**extra, "thinking_token_budget": 3},
    }
    if not stream:
        choice = chat(client, **kwargs).choices[0]
        calls, reasoning = choice.message.tool_calls or [], choice.message.reasoning  # type: ignore[attr-defined]
        assert choice.message.content in (None, "")
        finish = choice.finish_reason
    else:
        chunks = [c for c in chat(client, stream=True, **kwargs) if c.choices]
        deltas = [c.choices[0].delta for c in chunks]
        calls = [call for d in deltas for call in d.tool_calls or []]
        reasoning = "".join(getattr(d, "reasoning", None) or "" for d in deltas)
        assert "".join(d.content or "" for d in deltas) == ""
        finish = chunks[-1].choices[0].finish_reason
    assert reasoning and "tool_call" not in reasoning
    assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr,arg-type]
    assert finish == "tool_calls"


def test_bad_budgets_get_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        chat(client, extra_body={"thinking_token_budget": -1})
