"""SamplingParams end to end on the default model.

To stay cheap, almost every knob runs as one row of a single mixed batch (the
``batch`` fixture), next to plain greedy rows of the same prompts; the tests
then compare rows.  Mixing them also checks that per-row knobs do not leak into
their neighbours.  Checks that need a first result (stop_token_ids picked from a
greedy output, logprobs checked against teacher-forced prompt logprobs, a
seeded row re-run alone) run in a second, smaller batch.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from minivllm import LLM, SamplingParams
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.tokenizer import apply_chat_template

MAX_TOKENS = 12
STORY = "Once upon a time, in a small village at the edge of a dark forest, there lived"
COUNT = "1, 2, 3, 4, 5,"
REPEAT = "1, 2, 1, 2, 1, 2, 1, 2,"
FRENCH_CHAT = "Écris une phrase en français avec des accents."


def _greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, **kw})


def _random(**kw: Any) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": MAX_TOKENS, **kw})


@pytest.fixture(scope="module")
def llm() -> LLM:
    # Dequantized float32: sampled-token logprobs must equal the prompt logprobs of the
    # same tokens (to 2e-3), which the low-bit path's row-count-dependent kernels miss.
    return LLM(
        dtype="float32", quantization="none", optimization_level=0, num_gpu_blocks_override=256
    )


@pytest.fixture(scope="module")
def french(llm: LLM) -> dict[str, list[int]]:
    ids = apply_chat_template(
        llm.get_tokenizer(), [{"role": "user", "content": FRENCH_CHAT}], tokenize=True
    )
    assert isinstance(ids, list)
    return {"prompt_token_ids": ids}


@pytest.fixture(scope="module")
def banana(llm: LLM) -> int:
    return llm.get_tokenizer().encode(" banana")[0]


@pytest.fixture(scope="module")
def batch(llm: LLM, french: dict[str, list[int]], banana: int) -> dict[str, RequestOutput]:
    """Every independent knob as one named row of one batch."""
    special = llm.get_tokenizer().convert_tokens_to_ids("<|im_start|>")
    rows: dict[str, tuple[Any, SamplingParams]] = {
        "story": (STORY, _greedy()),
        "count": (COUNT, _greedy()),
        "repeat": (REPEAT, _greedy()),
        "presence": (STORY, _greedy(presence_penalty=2.0)),
        "frequency": (STORY, _greedy(frequency_penalty=2.0)),
        "repetition": (STORY, _greedy(repetition_penalty=2.0)),
        "negative_presence": (REPEAT, _greedy(presence_penalty=-2.0)),
        "seeded": (STORY, _random(seed=1)),
        "seeded_again": (STORY, _random(seed=1)),
        "other_seed": (STORY, _random(seed=2)),
        "top_k": (STORY, _random(seed=1, top_k=1)),
        "top_p": (STORY, _random(seed=1, top_p=0.01)),
        "min_p": (STORY, _random(seed=1, min_p=1.0)),
        "n2": (STORY, _random(n=2)),
        "bias": (STORY, _greedy(logit_bias={banana: 100.0})),
        "french": (french, _greedy(max_tokens=24)),
        "french_min_tokens": (french, _greedy(max_tokens=24, min_tokens=20)),
        "french_ignore_eos": (french, _greedy(max_tokens=24, ignore_eos=True)),
        "stop": (COUNT, _greedy(stop=[" 9", "never"])),
        "stop_incl": (COUNT, _greedy(stop=[" 9"], include_stop_str_in_output=True)),
        "stop_comma": (COUNT, _greedy(stop=[","])),
        "stop_comma_min_tokens": (COUNT, _greedy(stop=[","], min_tokens=4)),
        "allowed": (STORY, _random(seed=5, allowed_token_ids=[banana, 30, 198])),
        "logprobs": (COUNT, _greedy(logprobs=3)),
        "logprobs_random": (STORY, _random(seed=3, temperature=0.8, logprobs=2)),
        "prompt_logprobs": (STORY, _greedy(max_tokens=1, prompt_logprobs=20)),
        "zero_logprobs": (COUNT, _greedy(max_tokens=2, logprobs=0, prompt_logprobs=0)),
        "special_skip": (STORY, _greedy(max_tokens=3, logit_bias={special: 100.0})),
        "special_keep": (
            STORY,
            _greedy(max_tokens=3, logit_bias={special: 100.0}, skip_special_tokens=False),
        ),
    }
    outputs = llm.generate(
        [p for p, _ in rows.values()], [s for _, s in rows.values()], use_tqdm=False
    )
    return dict(zip(rows, outputs, strict=True))


def _one(out: RequestOutput) -> CompletionOutput:
    assert len(out.outputs) == 1
    return out.outputs[0]


def _ids(batch: dict[str, RequestOutput], name: str) -> list[int]:
    return list(_one(batch[name]).token_ids)


def test_max_tokens_and_length_reason(batch: dict[str, RequestOutput]) -> None:
    for name in ("story", "repeat", "seeded", "top_k"):
        c = _one(batch[name])
        assert len(c.token_ids) == MAX_TOKENS, name
        assert c.finish_reason == "length" and c.stop_reason is None, name


def test_n_gives_distinct_completions(batch: dict[str, RequestOutput]) -> None:
    out = batch["n2"]
    assert [c.index for c in out.outputs] == [0, 1]
    assert all(len(c.token_ids) == MAX_TOKENS for c in out.outputs)
    assert out.outputs[0].token_ids != out.outputs[1].token_ids


def test_seed_is_reproducible_and_matters(batch: dict[str, RequestOutput]) -> None:
    assert _ids(batch, "seeded") == _ids(batch, "seeded_again")
    assert _ids(batch, "seeded") != _ids(batch, "other_seed")
    # temperature 1 really samples: it leaves the greedy path.
    assert _ids(batch, "seeded") != _ids(batch, "story")


def test_truncation_knobs_are_applied(batch: dict[str, RequestOutput]) -> None:
    # Each, set to its extreme, leaves only the most likely token: sampling is greedy.
    greedy = _ids(batch, "story")
    for name in ("top_k", "top_p", "min_p"):
        assert _ids(batch, name) == greedy, name


def test_penalties_change_the_output(batch: dict[str, RequestOutput]) -> None:
    plain = _ids(batch, "story")
    for name in ("presence", "frequency", "repetition"):
        assert _ids(batch, name) != plain, name
    # Presence and frequency penalties look at output tokens only: nothing changes
    # until the greedy output is about to repeat one of its own tokens.
    first_repeat = next(i for i, t in enumerate(plain) if t in plain[:i])
    for name in ("presence", "frequency"):
        assert _ids(batch, name)[:first_repeat] == plain[:first_repeat], name
        assert _ids(batch, name)[first_repeat] != plain[first_repeat], name
    # A negative presence penalty rewards repeats: " 1, 2, 1, 2" becomes fewer distinct ids.
    assert len(set(_ids(batch, "negative_presence"))) < len(set(_ids(batch, "repeat")))


def test_logit_bias_forces_a_token(batch: dict[str, RequestOutput], banana: int) -> None:
    assert _ids(batch, "bias") == [banana] * MAX_TOKENS
    assert _ids(batch, "story")[0] != banana


def test_allowed_token_ids(batch: dict[str, RequestOutput], banana: int) -> None:
    tokens = _ids(batch, "allowed")
    assert set(tokens) <= {banana, 30, 198} and len(tokens) == MAX_TOKENS


def test_eos_min_tokens_and_ignore_eos(batch: dict[str, RequestOutput], llm: LLM) -> None:
    eos = llm.get_tokenizer().eos_token_id
    plain = _one(batch["french"])
    # The plain request ends on EOS well before max_tokens; EOS is no stop_reason.
    assert plain.finish_reason == "stop" and plain.stop_reason is None
    assert plain.token_ids[-1] == eos and len(plain.token_ids) < 20
    assert "<|im_end|>" not in plain.text

    at_least = _one(batch["french_min_tokens"])
    assert len(at_least.token_ids) >= 20
    assert eos not in at_least.token_ids[:20]
    assert at_least.token_ids[: len(plain.token_ids) - 1] == plain.token_ids[:-1]

    ignored = _one(batch["french_ignore_eos"])
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 24
    assert ignored.token_ids[: len(plain.token_ids)] == plain.token_ids


def test_stop_strings(batch: dict[str, RequestOutput]) -> None:
    full = _one(batch["count"]).text
    assert " 9" in full, full  # the premise of this test: " 6, 7, 8, 9, ..."
    cut = _one(batch["stop"])
    assert cut.finish_reason == "stop" and cut.stop_reason == " 9"
    assert cut.text == full[: full.index(" 9")]
    kept = _one(batch["stop_incl"])
    assert kept.stop_reason == " 9"
    assert kept.text == full[: full.index(" 9") + 2]
    # Generation stopped right there: no tokens past the one completing the stop string.
    assert len(cut.token_ids) < MAX_TOKENS
    # " 6, 7, ...": the first comma ends it; with min_tokens=4 the text of the first 4
    # tokens (" 6, ") is never searched, so the next comma does.
    assert _one(batch["stop_comma"]).text == full.split(",")[0]
    assert _one(batch["stop_comma_min_tokens"]).text == ",".join(full.split(",")[:2])


def test_skip_special_tokens(batch: dict[str, RequestOutput]) -> None:
    skipped, kept = _one(batch["special_skip"]), _one(batch["special_keep"])
    assert skipped.token_ids == kept.token_ids
    assert "<|im_start|>" not in skipped.text
    assert kept.text.count("<|im_start|>") == 3


def test_prompt_logprobs_shape(batch: dict[str, RequestOutput]) -> None:
    out = batch["prompt_logprobs"]
    prompt_ids = out.prompt_token_ids
    assert prompt_ids is not None and out.prompt_logprobs is not None
    assert len(out.prompt_logprobs) == len(prompt_ids)
    assert out.prompt_logprobs[0] is None
    for token_id, entry in zip(prompt_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert entry is not None and token_id in entry
        values = [lp.logprob for lp in entry.values()]
        assert all(v <= 0.0 for v in values)
        top = sorted((lp for lp in entry.values() if lp.rank is not None), key=lambda x: x.rank)
        # A distribution: the top 20 probabilities sum to at most 1, in rank order.
        probs = [math.exp(lp.logprob) for lp in top if lp.rank <= 20]
        assert sum(probs) <= 1.0 + 1e-4
        assert probs == sorted(probs, reverse=True)


def test_logprobs_shape(batch: dict[str, RequestOutput]) -> None:
    c = _one(batch["logprobs"])
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    total = 0.0
    for token_id, entry in zip(c.token_ids, c.logprobs, strict=True):
        # Greedy: the sampled token is the top-1, so the dict has exactly k entries.
        assert len(entry) == 3 and entry[token_id].rank == 1
        assert sorted(lp.rank for lp in entry.values()) == [1, 2, 3]
        assert entry[token_id].decoded_token is not None
        total += entry[token_id].logprob
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-4)
    # "1, 2, 3, 4, 5," -> " 6": the model is confident; raw logits would not be <= 0.
    assert math.exp(c.logprobs[0][c.token_ids[0]].logprob) > 0.3


def test_zero_logprobs_give_the_chosen_token_only(batch: dict[str, RequestOutput]) -> None:
    out = batch["zero_logprobs"]
    c = _one(out)
    assert c.logprobs is not None
    assert [list(entry) for entry in c.logprobs] == [[t] for t in c.token_ids]
    assert [e[t].rank for e, t in zip(c.logprobs, c.token_ids, strict=True)] == [1, 1]
    assert out.prompt_logprobs is not None and out.prompt_token_ids is not None
    assert out.prompt_logprobs[0] is None
    assert [list(e or {}) for e in out.prompt_logprobs[1:]] == [
        [t] for t in out.prompt_token_ids[1:]
    ]


@pytest.fixture(scope="module")
def second_batch(llm: LLM, batch: dict[str, RequestOutput]) -> dict[str, Any]:
    """Requests built from the first batch's results."""
    count_ids = _ids(batch, "count")
    stop_at = next(i for i, t in enumerate(count_ids) if i >= 3 and t not in count_ids[:i])
    rows: dict[str, tuple[Any, SamplingParams]] = {
        "stop_token": (COUNT, _greedy(stop_token_ids=[count_ids[stop_at]])),
    }
    for name in ("logprobs", "logprobs_random"):
        out = batch[name]
        assert out.prompt_token_ids is not None
        teacher = out.prompt_token_ids + list(_one(out).token_ids)
        rows[f"{name}_teacher"] = (
            {"prompt_token_ids": teacher},
            _greedy(max_tokens=1, prompt_logprobs=3),
        )
    outputs = llm.generate(
        [p for p, _ in rows.values()], [s for _, s in rows.values()], use_tqdm=False
    )
    result: dict[str, Any] = dict(zip(rows, outputs, strict=True))
    # The same seeded request as in the first batch, now alone in its own step.
    result["seeded_alone"] = llm.generate(STORY, _random(seed=1), use_tqdm=False)[0]
    result["stop_at"] = stop_at
    return result


def test_seed_does_not_depend_on_the_batch(
    batch: dict[str, RequestOutput], second_batch: dict[str, Any]
) -> None:
    # Same seed alone as in a batch of 25 mixed requests: the same tokens.
    assert list(_one(second_batch["seeded_alone"]).token_ids) == _ids(batch, "seeded")


def test_stop_token_ids(batch: dict[str, RequestOutput], second_batch: dict[str, Any]) -> None:
    full = _one(batch["count"])
    stop_at: int = second_batch["stop_at"]
    c = _one(second_batch["stop_token"])
    assert c.finish_reason == "stop"
    assert c.stop_reason == full.token_ids[stop_at]
    # The stop token is part of the ids but not of the text.
    assert c.token_ids == full.token_ids[: stop_at + 1]
    assert full.text.startswith(c.text) and len(c.text) < len(full.text)


@pytest.mark.parametrize("name", ["logprobs", "logprobs_random"])
def test_logprobs_equal_teacher_forced_prompt_logprobs(
    name: str, batch: dict[str, RequestOutput], second_batch: dict[str, Any]
) -> None:
    """Sample logprobs are the model's raw log-softmax: the same numbers the prompt
    logprobs give for those tokens fed back as a prompt (temperature not applied)."""
    c = _one(batch[name])
    teacher = second_batch[f"{name}_teacher"]
    num_prompt = len(batch[name].prompt_token_ids or [])
    assert c.logprobs is not None
    for j, (token_id, entry) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        reference = teacher.prompt_logprobs[num_prompt + j]
        # The top k, plus the sampled token when it is not among them.
        k = {"logprobs": 3, "logprobs_random": 2}[name]
        assert len(entry) == (k if entry[token_id].rank <= k else k + 1)
        assert entry[token_id].logprob == pytest.approx(reference[token_id].logprob, abs=2e-3)
        assert entry[token_id].rank == reference[token_id].rank
        top = {t for t, lp in entry.items() if lp.rank is not None and lp.rank <= 2}
        assert top == {t for t, lp in reference.items() if lp.rank is not None and lp.rank <= 2}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": -2}, "logprobs"),
    ],
)
def test_invalid_params_raise_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": 50}, "prompt_logprobs"),
        ({"logit_bias": {10**6: 1.0}}, "logit_bias"),
        ({"allowed_token_ids": [10**6]}, "allowed_token_ids"),
    ],
)
def test_invalid_params_for_the_model_raise_at_generate(
    llm: LLM, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        llm.generate(["Hello", "World"], SamplingParams(max_tokens=2, **kwargs), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
