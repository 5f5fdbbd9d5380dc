"""Greedy parity of the default model with HF transformers loading the same GGUF.

HF's reference is checked by teacher forcing: one HF forward pass over
prompt + our 64 generated tokens must pick, at every generated position, the
token we generated.  That holds exactly when HF's greedy decode of the prompt
produces our tokens (the first token where they differed would be a position
where HF's argmax is not ours), and it costs one batched forward instead of
512 sequential HF decode steps.

Our tokens (their first 32) must be the same whether the prompts run alone, all in
one batch, with chunked prefill forced to small chunks, or after a prefix-cache hit.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.transformers_utils.config import default_model_path

NUM_NEW_TOKENS = 64
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    ",
    "Q: What is 17 times 3?\nA:",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Les élèves ont appris que",
    "1, 1, 2, 3, 5, 8,",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
NUM_COMPARED = 32
"""Tokens of the other runs (alone, chunked, prefix hit), compared with the first 32
of the batched (HF-checked) run: greedy tokens do not depend on max_tokens."""
SHORTER = SamplingParams(temperature=0.0, max_tokens=NUM_COMPARED, ignore_eos=True)
# Float parity: weights dequantized ("none") and float32, as HF computes; the low-bit
# default is checked against this float path in test_gguf_quantized.py.
COMMON = dict(
    dtype="float32", quantization="none", optimization_level=0, num_gpu_blocks_override=256
)


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    import gguf
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    with pytest.MonkeyPatch.context() as mp:
        # HF's GGUF loading parses the file's metadata twice (config, then weights) and
        # builds gguf's tensor-name map once per submodule (~400 times): memoizing these
        # two pure look-ups halves its ~20 s and changes none of the weights it loads.
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="module")
def plain_llm() -> LLM:
    return LLM(enable_prefix_caching=False, **COMMON)


@pytest.fixture(scope="module")
def batched_tokens(plain_llm: LLM) -> list[list[int]]:
    outputs = plain_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _hf_argmax_agrees(
    model: torch.nn.Module, prompt_ids: list[list[int]], generated: list[list[int]]
) -> list[int]:
    """For each prompt, the index of the first generated token HF would not pick (-1: none)."""
    seqs = [p + g for p, g in zip(prompt_ids, generated, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
    first_bad = []
    for i, (p, g) in enumerate(zip(prompt_ids, generated, strict=True)):
        predicted = logits[i, len(p) - 1 : len(p) - 1 + len(g)].argmax(-1).tolist()
        first_bad.append(
            next((j for j, (a, b) in enumerate(zip(predicted, g, strict=True)) if a != b), -1)
        )
    return first_bad


def test_batched_greedy_equals_hf(
    plain_llm: LLM, batched_tokens: list[list[int]], hf_model: torch.nn.Module
) -> None:
    tokenizer = plain_llm.get_tokenizer()
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    assert all(len(t) == NUM_NEW_TOKENS for t in batched_tokens)
    assert _hf_argmax_agrees(hf_model, prompt_ids, batched_tokens) == [-1] * len(PROMPTS)


ALONE = (0, 4, 5)
"""The prompts run alone: the shortest, the chat-formatted one and the longest
(each alone costs 32 decode steps on the float32 path, ~3 s)."""


def test_alone_equals_batched(plain_llm: LLM, batched_tokens: list[list[int]]) -> None:
    for i in ALONE:
        out = plain_llm.generate(PROMPTS[i], SHORTER, use_tqdm=False)[0]
        assert list(out.outputs[0].token_ids) == batched_tokens[i][:NUM_COMPARED], PROMPTS[i]


def test_chunked_prefill_and_prefix_hit_equal_batched(batched_tokens: list[list[int]]) -> None:
    # A 16-token budget splits every prompt over several steps, mixed with decodes.
    llm = LLM(
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        max_num_seqs=8,
        block_size=8,
        **COMMON,
    )
    expected = [t[:NUM_COMPARED] for t in batched_tokens]
    first = llm.generate(PROMPTS, SHORTER, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in first] == expected
    # Same prompts again: their full blocks now come from the prefix cache.
    second = llm.generate(PROMPTS, SHORTER, use_tqdm=False)
    # Every full 8-token block of a prompt is a hit, but at least one token is computed.
    expected_hits = [(len(o.prompt_token_ids) - 1) // 8 * 8 for o in second]
    assert [o.num_cached_tokens for o in second] == expected_hits
    assert sum(expected_hits) >= 40
    assert [list(o.outputs[0].token_ids) for o in second] == expected
