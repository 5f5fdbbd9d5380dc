"""The reasoning parsers on scripted token streams: the whole text, token by token, and
the text cut at every position must all give the same (reasoning, content)."""

from __future__ import annotations

import pytest

from minivllm.entrypoints.openai.tool_parsers import get_tool_parser
from minivllm.reasoning import (
    REASONING_PARSERS,
    DeltaReasoning,
    ReasoningParser,
    get_reasoning_parser,
    new_reasoning_parser,
)

# (name, token stream, expected reasoning, expected content): the same for every parser
# with the <think> markers (deepseek_r1, qwen3 with thinking on, generic).
CASES = [
    (
        "whole",
        ["<think>", "\n", "Let me", " think", "</think>", "\n\n", "It is", " 4"],
        "\nLet me think",
        "\n\nIt is 4",
    ),
    ("start in the prompt", ["I", " guess", "</think>", "OK"], "I guess", "OK"),
    (
        "markers split across tokens",
        ["<th", "ink>", "ab", "</", "thi", "nk", ">", "cd"],
        "ab",
        "cd",
    ),
    ("no end marker", ["<think>", "still", " going"], "still going", None),
    ("reasoning only", ["<think>", "x", "</think>"], "x", None),
    ("empty reasoning", ["<think>", "</think>", "hi"], None, "hi"),
    (
        "near misses are text",
        ["<thin", "g> a </", "thinker>", " b", "</think>", "c <think> d", "</think>"],
        "<thing> a </thinker> b",
        "c <think> d</think>",
    ),
    (
        "tool call after reasoning",
        [
            "<think>",
            "I could use <tool_call>",
            " here",
            "</think>",
            "\n",
            "<tool_call>",
            '{"name": "f", "arguments": {"x": 1}}',
            "</tool_call>",
        ],
        "I could use <tool_call> here",
        '\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    ),  # fmt: skip
]
THINK_PARSERS = ["deepseek_r1", "qwen3", "generic"]


def make(name: str, **kwargs: object) -> ReasoningParser:
    if name == "generic":
        return new_reasoning_parser(name, "<think>", "</think>", **kwargs)  # type: ignore[arg-type]
    return new_reasoning_parser(name, **kwargs)  # type: ignore[arg-type]


def streamed(parser: ReasoningParser, deltas: list[str]) -> tuple[str | None, str | None]:
    """Feed ``deltas`` one by one (then finish); no delta may show marker text that the
    expected parts do not hold."""
    parts: list[DeltaReasoning] = []
    for i, delta in enumerate(deltas):
        parts.append(parser.feed(delta, [i], final=i == len(deltas) - 1))
    if not deltas:
        parts.append(parser.feed("", final=True))
    reasoning = "".join(p.reasoning or "" for p in parts) or None
    content = "".join(p.content or "" for p in parts) or None
    return reasoning, content


@pytest.mark.parametrize("parser_name", THINK_PARSERS)
@pytest.mark.parametrize(
    ("case", "tokens", "reasoning", "content"), CASES, ids=[c[0] for c in CASES]
)
def test_whole_stream_and_every_split_agree(parser_name, case, tokens, reasoning, content) -> None:  # noqa: ANN001
    text = "".join(tokens)
    assert make(parser_name).extract_reasoning(text) == (reasoning, content)
    assert streamed(make(parser_name), tokens) == (reasoning, content)
    for cut in range(len(text) + 1):
        assert streamed(make(parser_name), [text[:cut], text[cut:]]) == (reasoning, content), cut


@pytest.mark.parametrize("parser_name", THINK_PARSERS)
def test_a_held_back_marker_prefix_is_released_in_order(parser_name) -> None:  # noqa: ANN001
    parser = make(parser_name)
    assert parser.feed("abc</thi") == DeltaReasoning(reasoning="abc")
    assert not parser.reasoning_ended
    # Not the marker after all: the held text goes out as reasoning, in order.
    assert parser.feed("s is text") == DeltaReasoning(reasoning="</this is text")
    assert parser.feed("</think>x") == DeltaReasoning(content="x")
    assert parser.reasoning_ended
    assert parser.feed("</th", final=True) == DeltaReasoning(content="</th")


def test_generic_parser_takes_any_markers_even_multi_character_ones() -> None:
    parser = new_reasoning_parser("", "<|begin_of_thought|>", "<|end_of_thought|>")
    tokens = ["<|begin", "_of_thought|>", "plan", "<|end_of", "_thought", "|>", "done"]
    assert streamed(parser, tokens) == ("plan", "done")
    parser = new_reasoning_parser("", "<|begin_of_thought|>", "<|end_of_thought|>")
    # The usual <think> tags mean nothing to it.
    assert parser.extract_reasoning("<think>a</think>b") == ("<think>a</think>b", None)


def test_qwen3_without_thinking_passes_everything_through_as_content() -> None:
    off = {"enable_thinking": False}
    for tokens in (["The", " answer"], ["a", "</think>", "b"]):
        parser = make("qwen3", chat_template_kwargs=off)
        assert streamed(parser, tokens) == (None, "".join(tokens))
        assert make("qwen3", chat_template_kwargs=off).extract_reasoning("".join(tokens)) == (
            None,
            "".join(tokens),
        )
    # Only qwen3 reads the switch; deepseek_r1 keeps parsing.
    assert make("deepseek_r1", chat_template_kwargs=off).extract_reasoning("a</think>b") == (
        "a",
        "b",
    )
    assert make("qwen3", chat_template_kwargs={"enable_thinking": True}).extract_reasoning(
        "a</think>b"
    ) == ("a", "b")


def test_tool_calls_are_found_in_the_answer_only() -> None:
    hermes = get_tool_parser("hermes")
    fake = '<tool_call>{"name": "wrong", "arguments": {}}</tool_call>'
    real = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    text = f"<think>maybe {fake}?</think>\n{real}"
    # On the whole text the tool parser would take the call in the thinking too.
    assert [c.name for c in hermes.extract(text)[1]] == ["wrong", "get_weather"]
    reasoning, content = make("qwen3").extract_reasoning(text)
    assert reasoning == f"maybe {fake}?"
    _, calls = hermes.extract(content or "")
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]


def test_registry_and_bad_names() -> None:
    assert sorted(REASONING_PARSERS) == ["deepseek_r1", "generic", "qwen3"]
    assert get_reasoning_parser("qwen3").end_str == "</think>"
    with pytest.raises(ValueError, match="choose one of deepseek_r1, generic, qwen3"):
        get_reasoning_parser("nope")
    with pytest.raises(ValueError, match="reasoning_start_str and reasoning_end_str"):
        new_reasoning_parser("generic")
    # A family's markers can be replaced.
    parser = new_reasoning_parser("deepseek_r1", end_str="[/THINK]")
    assert parser.extract_reasoning("a[/THINK]b") == ("a", "b")
