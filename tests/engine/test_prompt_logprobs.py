"""prompt_logprobs against an independent reference: log_softmax of the Hugging Face
model's own float32 logits, on a tiny random model, through chunked prefill and the
sliced logits computation."""

from __future__ import annotations

import pytest
import torch
from model_helpers import save_random_hf_model

from minivllm import LLM, SamplingParams
from minivllm.sample import logprobs as logprobs_module


def test_prompt_logprobs_match_the_hf_models_log_softmax(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    hf, _ = save_random_hf_model(tmp_path, tie_word_embeddings=False)
    # Slices of 5 positions inside prefill chunks of 16: both boundaries are crossed.
    monkeypatch.setattr(logprobs_module, "PROMPT_LOGPROBS_ROWS", 5)
    llm = LLM(
        model=str(tmp_path),
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=0,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=16,
    )
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    (out,) = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)

    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0].float()
    reference = logits.log_softmax(-1)
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for pos in range(1, len(prompt)):
        entry, want = got[pos], reference[pos - 1]
        assert entry is not None
        token = prompt[pos]
        assert entry[token].logprob == pytest.approx(float(want[token]), abs=1e-4)
        assert entry[token].rank == int((want >= want[token]).sum())
        top3 = set(want.topk(3).indices.tolist())
        assert {t for t, lp in entry.items() if lp.rank is not None and lp.rank <= 3} >= top3
        assert set(entry) <= top3 | {token}
