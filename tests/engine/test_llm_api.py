"""The offline `LLM` API: prompt forms, chat with the model's template, progress bar."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", optimization_level=0, num_gpu_blocks_override=128)


@pytest.fixture(scope="module")
def expected(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_every_prompt_form_gives_the_same_result(llm: LLM, expected: list[list[int]]) -> None:
    tokenizer = llm.get_tokenizer()
    ids = [tokenizer.encode(p) for p in PROMPTS]
    forms = {
        "str": [PROMPTS[0]],
        "token ids": ids[0],
        "text dicts": [{"prompt": p} for p in PROMPTS],
        "token dicts": [{"prompt_token_ids": i} for i in ids],
        "lists of token ids": ids,
        "tuple of str": tuple(PROMPTS),
    }
    outs: dict[str, list[RequestOutput]] = {}
    for name, prompts in forms.items():
        outs[name] = llm.generate(prompts, GREEDY, use_tqdm=False)
        n = len(outs[name])
        assert _tokens(outs[name]) == expected[:n], name
    # Text prompts keep their text; token prompts have none, and ids are always there.
    assert outs["str"][0].prompt == PROMPTS[0]
    assert outs["token ids"][0].prompt is None
    assert [o.prompt_token_ids for o in outs["lists of token ids"]] == ids
    assert [o.prompt for o in outs["text dicts"]] == PROMPTS
    # One SamplingParams per prompt is accepted too, and must match the count.
    per_prompt = [GREEDY, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)]
    outputs = llm.generate(PROMPTS, per_prompt, use_tqdm=False)
    assert [len(t) for t in _tokens(outputs)] == [4, 2]
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate(PROMPTS, [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([{"text": "no such key"}], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_chat_renders_the_template_and_generates(llm: LLM) -> None:
    tokenizer = llm.get_tokenizer()
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    (out,) = llm.chat(conversation, params, use_tqdm=False)
    rendered = tokenizer.decode(out.prompt_token_ids)
    # SmolLM2's ChatML template, ending with the assistant turn to fill in.
    assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert "<|im_start|>user\nName a colour.<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    assert rendered.count("<|im_start|>") == 3  # no doubled BOS / markers
    assert out.outputs[0].text.strip()
    # Same ids as the plain prompt of the rendered text.
    again = llm.generate({"prompt_token_ids": list(out.prompt_token_ids or [])}, params)
    assert again[0].outputs[0].token_ids == out.outputs[0].token_ids

    # Several conversations at once, and a custom template.
    outs = llm.chat([conversation[1:], conversation], params, use_tqdm=False)
    assert len(outs) == 2 and outs[0].prompt_token_ids != outs[1].prompt_token_ids
    custom = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    (plain,) = llm.chat(conversation[1:], params, use_tqdm=False, chat_template=custom)
    assert tokenizer.decode(plain.prompt_token_ids) == "[user] Name a colour.\n[assistant]"


def test_progress_bar_for_long_batches(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate(["Hi"] * 7, tiny)
    assert "Processed prompts" not in capsys.readouterr().err
    outputs = llm.generate(["Hi"] * 8, tiny)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "8/8" in err
    assert len(outputs) == 8
    llm.generate(["Hi"] * 8, tiny, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err


def test_explicit_engine_ids_do_not_collide_with_generated_ones(
    llm: LLM, expected: list[list[int]]
) -> None:
    engine = llm.llm_engine
    # Ids the engine would generate next, taken by a caller first.
    taken = [str(n) for n in range(200)]
    for request_id in taken:
        engine.add_request(request_id, PROMPTS[0], SamplingParams(max_tokens=1))
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    assert not {o.request_id for o in outputs} & set(taken)
    assert not engine.has_unfinished_requests()


def test_a_small_token_budget_alone_is_enough(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from model_helpers import save_random_hf_model

    # As in vLLM: max_num_seqs, left unset, shrinks to the budget instead of conflicting.
    save_random_hf_model(tmp_path, tie_word_embeddings=False)
    llm = LLM(
        model=str(tmp_path),
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=0,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=64,
    )
    sched = llm.llm_engine.vllm_config.scheduler_config
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (64, 64)
    prompt = {"prompt_token_ids": list(range(1, 100))}  # longer than one step's budget
    (out,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens
