"""Request life cycle through `LLMEngine`: abort, rejected requests, failures, streaming text.

- Aborting a request mid-generation frees all of its KV blocks in that call, and the
  pool is back at its idle size once every request is gone.
- A request that could never finish (prompt + max_tokens > max_model_len) is
  rejected with the numbers and does not change what the other requests generate;
  a KV cache smaller than the model's context lowers max_model_len to what fits.
- Streamed (DELTA) text of multi-byte characters adds up to the tokenizer's own
  decoding of the ids, and never contains a half character.
"""

from __future__ import annotations

from typing import Any

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.llm_engine import LLMEngine
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind
from minivllm.tokenizer import apply_chat_template

MAX_MODEL_LEN = 256
COMMON: dict[str, Any] = dict(dtype="float32", optimization_level=0, block_size=8)
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "1, 1, 2, 3, 5, 8,"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(num_gpu_blocks_override=64, max_model_len=MAX_MODEL_LEN, **COMMON)


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[list[int]]:
    return [list(llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) for p in PROMPTS]


def _run(engine: LLMEngine) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


def test_abort_frees_every_block_at_once(llm: LLM) -> None:
    engine = llm.llm_engine
    manager = engine.scheduler.kv_cache_manager
    idle = manager.num_free_blocks
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], long)
    engine.add_request("b", PROMPTS[1], SamplingParams(temperature=0.7, n=2, max_tokens=40))
    engine.add_request("c", PROMPTS[2], long)
    for _ in range(12):  # mid-generation: prompts done, a few decode blocks taken
        engine.step()
    held = {rid: len(manager.get_block_ids(rid)) for rid in ("a", "0_b", "1_b", "c")}
    assert all(n >= 2 for n in held.values()), held

    before = manager.num_free_blocks
    (out,) = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert 0 < len(out.outputs[0].token_ids) < 40
    # Its blocks are free right away, before any further step.
    assert manager.num_free_blocks == before + held["a"]
    assert manager.get_block_ids("a") == []

    # Aborting a parent aborts all of its n children.
    outs = engine.abort_request(["b"])
    assert [c.finish_reason for c in outs[-1].outputs] == ["abort", "abort"]
    assert manager.num_free_blocks == before + held["a"] + held["0_b"] + held["1_b"]

    engine.abort_request("c")
    assert not engine.has_unfinished_requests()
    assert manager.num_free_blocks == idle
    engine.step()  # the worker forgets them; nothing is left to run
    assert manager.num_free_blocks == idle
    assert engine.executor.worker.model_runner.states == {}


def test_abort_of_a_waiting_request(llm: LLM) -> None:
    engine = llm.llm_engine
    idle = engine.scheduler.kv_cache_manager.num_free_blocks
    engine.add_request("w", PROMPTS[0], GREEDY)
    (out,) = engine.abort_request("w")
    assert out.outputs[0].finish_reason == "abort" and out.outputs[0].token_ids == []
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv_cache_manager.num_free_blocks == idle


def test_too_long_request_is_rejected_with_the_numbers(llm: LLM) -> None:
    tokenizer = llm.get_tokenizer()
    num_prompt = len(tokenizer.encode(PROMPTS[0]))
    params = SamplingParams(max_tokens=MAX_MODEL_LEN)
    with pytest.raises(ValueError) as info:
        llm.generate(PROMPTS[0], params, use_tqdm=False)
    message = str(info.value)
    for number in (MAX_MODEL_LEN, num_prompt, MAX_MODEL_LEN + num_prompt):
        assert str(number) in message, message
    assert "max_tokens" in message
    # A prompt alone longer than the context is rejected too.
    with pytest.raises(ValueError, match=str(MAX_MODEL_LEN)):
        llm.generate({"prompt_token_ids": [1] * (MAX_MODEL_LEN + 1)}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_rejected_request_does_not_affect_others(llm: LLM, alone: list[list[int]]) -> None:
    engine = llm.llm_engine
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(f"good{i}", prompt, GREEDY)
    engine.step()
    with pytest.raises(ValueError):
        engine.add_request("bad", PROMPTS[2], SamplingParams(max_tokens=MAX_MODEL_LEN))
    with pytest.raises(ValueError, match="out of vocabulary"):
        engine.add_request("bad2", {"prompt_token_ids": [10**7]}, GREEDY)
    # Refused by the scheduler (a priority under fcfs) after the engine's own checks.
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("bad3", PROMPTS[2], SamplingParams(n=2, max_tokens=4), priority=1)
    engine.add_request("good2", PROMPTS[2], GREEDY)
    finished = _run(engine)
    assert sorted(finished) == ["good0", "good1", "good2"]
    assert [list(finished[f"good{i}"].outputs[0].token_ids) for i in range(3)] == alone

    # LLM.generate with one bad prompt among good ones raises and leaves nothing behind.
    with pytest.raises(ValueError):
        llm.generate(
            [PROMPTS[0], PROMPTS[1]],
            [GREEDY, SamplingParams(max_tokens=MAX_MODEL_LEN)],
            use_tqdm=False,
        )
    assert not engine.has_unfinished_requests()
    # Nothing of a refused request lingers: its id can be used again.
    assert engine.output_processor.states == {} and engine.output_processor.parents == {}
    engine.add_request("bad3", PROMPTS[2], GREEDY)
    engine.abort_request("bad3")
    again = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in again] == alone


def test_small_kv_cache_lowers_max_model_len_and_refuses_what_cannot_fit(
    alone: list[list[int]],
) -> None:
    # 4 usable blocks of 8: 32 tokens. max_model_len was not chosen, so the engine lowers
    # it to what one request can use, instead of cutting requests short at run time.
    small = LLM(num_gpu_blocks_override=5, enable_prefix_caching=False, **COMMON)
    engine = small.llm_engine
    manager = engine.scheduler.kv_cache_manager
    assert engine.model_config.max_model_len == manager.max_num_tokens == 32
    greedy_long = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    with pytest.raises(ValueError, match="maximum context length is 32"):
        small.generate([PROMPTS[1], PROMPTS[0]], [greedy_long, GREEDY], use_tqdm=False)
    outputs = small.generate([PROMPTS[0], PROMPTS[2]], GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == [alone[0], alone[2]]
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks

    # A prompt longer than the whole cache is refused up front, and leaves nothing behind.
    with pytest.raises(ValueError, match="32"):
        small.generate(
            [PROMPTS[0], {"prompt_token_ids": [5] * 40}],
            SamplingParams(n=2, temperature=1.0, max_tokens=2),
            use_tqdm=False,
        )
    assert not engine.has_unfinished_requests()
    assert engine.output_processor.states == {} and engine.output_processor.parents == {}
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks


@pytest.mark.parametrize(
    "message",
    [
        "Écris une phrase en français avec des accents.",
        "Translate 'good morning' to Japanese.",
    ],
)
def test_streamed_multibyte_text_equals_decoded_ids(llm: LLM, message: str) -> None:
    engine = llm.llm_engine
    tokenizer = llm.get_tokenizer()
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": message}], tokenize=True)
    params = SamplingParams(temperature=0.0, max_tokens=16, output_kind=RequestOutputKind.DELTA)
    engine.add_request("s", {"prompt_token_ids": ids}, params)
    pieces: list[str] = []
    token_ids: list[int] = []
    finish_reason = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.append(out.outputs[0].text)
            token_ids.extend(out.outputs[0].token_ids)
            finish_reason = out.outputs[0].finish_reason
    text = "".join(pieces)
    decoded = tokenizer.decode(token_ids, skip_special_tokens=True)
    if finish_reason == "length":
        # Cut by max_tokens inside a character: its first bytes never become text.
        decoded = decoded.rstrip("\ufffd")
    assert text == decoded
    assert "\ufffd" not in text and any(ord(ch) > 127 for ch in text), text
    # The premise: some character is split over tokens that do not decode on their own.
    assert any("\ufffd" in tokenizer.decode([t]) for t in token_ids)
    # No delta ever carried half a character.
    assert not any("\ufffd" in piece for piece in pieces)


def test_streamed_text_never_shows_a_stop_string(llm: LLM) -> None:
    engine = llm.llm_engine
    prompt = "1, 2, 3, 4, 5,"
    full = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    full_text = full[0].outputs[0].text
    assert " 9" in full_text
    params = SamplingParams(
        temperature=0.0, max_tokens=12, stop=[" 9"], output_kind=RequestOutputKind.DELTA
    )
    engine.add_request("s", prompt, params)
    pieces: list[str] = []
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.append(out.outputs[0].text)
            last = out
    assert last is not None and last.finished and last.outputs[0].stop_reason == " 9"
    assert "".join(pieces) == full_text[: full_text.index(" 9")]
    # Streaming went on piece by piece, not all at the end.
    assert sum(1 for p in pieces if p) > 2


def test_streamed_children_of_one_request_each_get_their_deltas(llm: LLM) -> None:
    """With n=2 both children usually advance in the same step; each delta must arrive."""
    engine = llm.llm_engine
    prompt = "Once upon a time, there lived"
    final = llm.generate(
        prompt, SamplingParams(temperature=1.0, seed=11, n=2, max_tokens=6), use_tqdm=False
    )[0]
    stream = SamplingParams(
        temperature=1.0, seed=11, n=2, max_tokens=6, output_kind=RequestOutputKind.DELTA
    )
    engine.add_request("n2", prompt, stream)
    tokens: dict[int, list[int]] = {0: [], 1: []}
    texts: dict[int, str] = {0: "", 1: ""}
    finished = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "n2"
            finished = out.finished
            for c in out.outputs:
                tokens[c.index] += c.token_ids
                texts[c.index] += c.text
    assert finished
    assert [tokens[0], tokens[1]] == [list(c.token_ids) for c in final.outputs]
    assert [texts[0], texts[1]] == [c.text for c in final.outputs]


def test_max_tokens_none_runs_to_the_context_length() -> None:
    short = LLM(max_model_len=24, num_gpu_blocks_override=8, **COMMON)
    out = short.generate(
        PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    )[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids or []) + len(out.outputs[0].token_ids) == 24
