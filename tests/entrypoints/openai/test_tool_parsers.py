"""The tool-call parsers and the tool_choice plan, without a server."""

from __future__ import annotations

import json

import pytest

from minivllm.entrypoints.openai.tool_parsers import get_tool_parser
from minivllm.entrypoints.openai.tool_parsers.base import ParsedToolCall
from minivllm.entrypoints.openai.tool_stream import ToolStream
from minivllm.entrypoints.openai.tools import AUTO_NEEDS_FLAGS, ChatCompletionToolsParam, ToolPlan

TOOLS = [ChatCompletionToolsParam(function={"name": "f", "parameters": {"type": "object"}})]


def test_hermes() -> None:
    parser = get_tool_parser("hermes")
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert parser.extract(text) == ("Sure.", [ParsedToolCall("f", '{"a": 1}')])
    # SmolLM2 writes a list inside one tag; a cut-off end tag still parses.
    listed = '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]</tool'
    assert [c.name for c in parser.extract(listed)[1]] == ["f", "g"]
    assert parser.extract("no call here") == ("no call here", [])
    assert parser.extract("<tool_call>{broken</tool_call>")[1] == []
    # Streaming: a possible start tag is held back, content before it is not.
    assert parser.content_end("Hello <tool") == len("Hello ")
    assert parser.content_end("Hello <tool_call>{") == len("Hello ")
    assert parser.content_end("Hello") == len("Hello")


def test_llama3_json() -> None:
    parser = get_tool_parser("llama3_json")
    text = '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    assert parser.extract(text) == (
        None,
        [ParsedToolCall("f", '{"a": 1}'), ParsedToolCall("g", "{}")],
    )
    assert parser.extract("The answer is 4.") == ("The answer is 4.", [])
    assert parser.content_end("  ") == 0 and parser.content_end('{"na') == 0
    assert parser.content_end("The") == 3
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("mistral")


def test_plans() -> None:
    with pytest.raises(ValueError, match=AUTO_NEEDS_FLAGS):
        ToolPlan.of(TOOLS, None, None, enable_auto=False)
    with pytest.raises(ValueError, match="needs tools"):
        ToolPlan.of(None, "required", None, enable_auto=False)
    plan = ToolPlan.of(TOOLS, "required", None, enable_auto=False)
    assert plan is not None
    schema = plan.constraint(TOOLS, parallel_tool_calls=False).json
    assert schema["maxItems"] == 1 and schema["items"]["properties"]["name"]["enum"] == ["f"]
    content, calls = plan.extract('[{"name": "f", "parameters": {"x": 2}}]')
    assert content is None and json.loads(calls[0].function.arguments) == {"x": 2}
    assert ToolPlan.of(TOOLS, "none", None, enable_auto=False).template_tools is None


def test_stream_holds_back_an_auto_call() -> None:
    plan = ToolPlan.of(TOOLS, "auto", get_tool_parser("hermes"), enable_auto=True)
    stream = ToolStream(plan)
    sent = [
        stream.feed(piece) for piece in ["Hi ", "<tool", '_call>{"name": "f", ', '"arguments": {}}']
    ]
    assert sent[0].content == "Hi " and sent[1:] == [None, None, None]
    final = stream.finish()
    assert final.tool_calls[0].function.name == "f" and stream.tools_called


def test_stream_sends_required_calls_whole_with_indices() -> None:
    plan = ToolPlan.of(TOOLS, "required", None, enable_auto=False)
    stream = ToolStream(plan)
    assert stream.feed('[{"name": "f", "parameters": {}}, ') is None
    assert stream.feed('{"name": "f", "parameters": {"y": 1}}]') is None
    final = stream.finish()
    assert [d.index for d in final.tool_calls] == [0, 1]
    assert len({d.id for d in final.tool_calls}) == 2
    assert json.loads(final.tool_calls[1].function.arguments) == {"y": 1}
