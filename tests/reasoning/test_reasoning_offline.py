"""Offline (`LLM`): the generic parser with an end marker the tokenizer splits over
several tokens; the thinking budget forces all of them through the real sampler, and
the grammar takes over after the last one.

Slow (an engine of its own): test_thinking_gate.py covers multi-token forcing on
scripted ids, test_reasoning_server.py the sampler path with a one-token marker."""

from __future__ import annotations

from pathlib import Path

import pytest
from reasoning_model import build_reasoning_model

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

END = "</reasoning>"  # not a token of the tiny model's vocabulary: several tokens


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = build_reasoning_model(tmp_path_factory.mktemp("reasoning-model"))
    return LLM(
        str(Path(path)),
        reasoning_start_str="<think>",
        reasoning_end_str=END,
        max_model_len=256,
        num_gpu_blocks_override=32,
        optimization_level=0,
    )


def test_budget_forces_a_multi_token_end_marker_then_the_grammar(llm: LLM) -> None:
    tokenizer = llm.get_tokenizer()
    end_ids = tokenizer.encode(END, add_special_tokens=False)
    assert len(end_ids) > 1
    prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>")
    params = SamplingParams(
        temperature=0,
        max_tokens=16,
        thinking_token_budget=3,
        structured_outputs={"choice": ["yes", "no"]},
    )
    [out] = llm.generate({"prompt_token_ids": prompt}, params)
    ids = out.outputs[0].token_ids
    assert ids[3 : 3 + len(end_ids)] == end_ids
    answer = tokenizer.decode(ids[3 + len(end_ids) :], skip_special_tokens=True)
    assert answer in ("yes", "no")
    reasoning = tokenizer.decode(ids[:3])
    parser = llm.llm_engine.vllm_config.reasoning_config.new_parser()  # type: ignore[union-attr]
    assert parser.extract_reasoning(out.outputs[0].text) == (reasoning or None, answer)
