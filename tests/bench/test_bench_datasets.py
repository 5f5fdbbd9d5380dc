"""The bench datasets: exact-length random prompts and ShareGPT files."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.bench.datasets import (
    SHAREGPT_MAX_PROMPT_LEN,
    add_dataset_args,
    exact_length_prompt,
    get_samples,
    sample_random,
    sample_sharegpt,
)


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_exact_length_prompt_round_trips(tokenizer: Any, length: int, seed: int) -> None:
    text, ids = exact_length_prompt(tokenizer, length, random.Random(seed))
    assert len(ids) == length
    assert tokenizer(text).input_ids == ids  # what a server would count


@pytest.mark.parametrize("input_len", [1, 16, 128, 512])
def test_random_dataset_has_exact_input_lengths(tokenizer: Any, input_len: int) -> None:
    requests = sample_random(tokenizer, 6, input_len, 7, range_ratio=0.0, seed=3)
    assert len(requests) == 6
    for r in requests:
        assert r.prompt_len == input_len
        assert len(tokenizer(r.prompt).input_ids) == input_len
        assert r.prompt_token_ids == tokenizer(r.prompt).input_ids
        assert r.expected_output_len == 7
    assert len({r.prompt for r in requests}) == 6, "prompts should differ"


def test_random_dataset_range_ratio_and_seed(tokenizer: Any) -> None:
    requests = sample_random(tokenizer, 30, 40, 20, range_ratio=0.5, seed=1)
    in_lens = [r.prompt_len for r in requests]
    out_lens = [r.expected_output_len for r in requests]
    assert all(20 <= n <= 60 for n in in_lens) and len(set(in_lens)) > 1
    assert all(10 <= n <= 30 for n in out_lens) and len(set(out_lens)) > 1
    for r in requests:
        assert len(tokenizer(r.prompt).input_ids) == r.prompt_len
    again = sample_random(tokenizer, 30, 40, 20, range_ratio=0.5, seed=1)
    assert [r.prompt for r in again] == [r.prompt for r in requests]
    other = sample_random(tokenizer, 30, 40, 20, range_ratio=0.5, seed=2)
    assert [r.prompt for r in other] != [r.prompt for r in requests]


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_random_dataset_rejects_bad_range_ratio(tokenizer: Any, ratio: float) -> None:
    with pytest.raises(ValueError, match="--range-ratio"):
        sample_random(tokenizer, 2, 16, 8, range_ratio=ratio)


def _conversation(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"conversations": [{"from": who, "value": text} for who, text in turns]}


@pytest.fixture
def sharegpt_file(tmp_path: Path) -> Path:
    data = [
        _conversation(
            ("human", "What is the capital of France? Answer briefly."),
            ("gpt", "The capital of France is Paris, a city on the Seine."),
        ),
        _conversation(
            ("system", "You are terse."),
            ("human", "Name three primary colours, please."),
            ("gpt", "Red, yellow and blue are the three primary colours."),
            ("human", "Thanks!"),
        ),
        _conversation(("gpt", "A reply without a question before it, which is skipped.")),
        _conversation(("human", "Hi"), ("gpt", "Hello there, how can I help you today?")),
        _conversation(("human", "Tell me a story about a dragon."), ("gpt", "Ok.")),
        _conversation(("human", "word " * (SHAREGPT_MAX_PROMPT_LEN + 50)), ("gpt", "Too long!")),
        {"id": "no conversations key"},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_reads_first_human_turn_and_reply_length(
    tokenizer: Any, sharegpt_file: Path
) -> None:
    requests = sample_sharegpt(tokenizer, sharegpt_file, 2, output_len=None, seed=0)
    by_prompt = {r.prompt: r for r in requests}
    # Kept: the two pairs with a prompt and a reply of >= 4 tokens and a prompt <= 1024.
    assert set(by_prompt) == {
        "What is the capital of France? Answer briefly.",
        "Name three primary colours, please.",
    }
    for r in requests:
        assert r.prompt_token_ids == tokenizer(r.prompt).input_ids
    reply = "The capital of France is Paris, a city on the Seine."
    expected = len(tokenizer(reply, add_special_tokens=False).input_ids)
    assert by_prompt["What is the capital of France? Answer briefly."].expected_output_len == (
        expected
    )


def test_sharegpt_fixed_output_len_keeps_short_replies_and_oversamples(
    tokenizer: Any, sharegpt_file: Path
) -> None:
    requests = sample_sharegpt(tokenizer, sharegpt_file, 7, output_len=5, seed=0)
    assert len(requests) == 7
    assert all(r.expected_output_len == 5 for r in requests)
    prompts = {r.prompt for r in requests}
    # The "Ok." reply is short but the output length is fixed, so that pair counts;
    # "Hi" is still too short a prompt and the long one is still too long.
    assert "Tell me a story about a dragon." in prompts
    assert "Hi" not in prompts
    assert all(len(p) < 1000 for p in prompts)


def test_sharegpt_errors(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a file"):
        sample_sharegpt(tokenizer, tmp_path / "missing.json", 2)
    bad = tmp_path / "bad.json"
    bad.write_text('{"conversations": []}')
    with pytest.raises(ValueError, match="JSON list"):
        sample_sharegpt(tokenizer, bad, 2)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([_conversation(("human", "Hi"), ("gpt", "Yo"))]))
    with pytest.raises(ValueError, match="no usable conversation"):
        sample_sharegpt(tokenizer, empty, 2)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dataset_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(list(argv))


def test_get_samples_from_flags(tokenizer: Any, sharegpt_file: Path) -> None:
    requests = get_samples(_parse("--num-prompts", "3", "--input-len", "9"), tokenizer)
    assert [r.prompt_len for r in requests] == [9, 9, 9]
    assert all(r.expected_output_len == 128 for r in requests)  # the random default
    shared = get_samples(
        _parse("--dataset", "sharegpt", "--dataset-path", str(sharegpt_file), "--num-prompts", "2"),
        tokenizer,
    )
    assert len(shared) == 2
    with pytest.raises(ValueError, match="needs --dataset-path"):
        get_samples(_parse("--dataset", "sharegpt"), tokenizer)
    with pytest.raises(ValueError, match="--num-prompts"):
        get_samples(_parse("--num-prompts", "0"), tokenizer)
