"""Tiny random Llama / Qwen2 / Qwen3 / Gemma 3 checkpoints: our logits equal HF's (float32)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import save_random_hf_model
from mx_helpers import PagedRunner

from minivllm.model_executor.loader import load_model
from minivllm.model_executor.models import get_model_class, supported_architectures

CASES = {
    "llama-untied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama-tied-bias": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(tie_word_embeddings=True, attention_bias=True, rope_theta=5e5),
    ),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3-untied": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(tie_word_embeddings=False, head_dim=32),
    ),
    # A 5-token window on the local layer (the prompts are longer), its own rope base,
    # and a query scale other than the head size.
    "gemma3-window": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=32,
            query_pre_attn_scalar=20,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
            },
        ),
    ),
}
ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    """(HF model, our model) sharing one saved random checkpoint."""
    cfg_name, arch, extra = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf, cfg = save_random_hf_model(path, cfg_name, arch, max_position_embeddings=128, **extra)
    ours = load_model(path, cfg, torch.float32)
    return hf, ours


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def test_single_prefill(checkpoint):
    hf, ours = checkpoint
    ids = torch.randint(0, 128, (13,), generator=torch.Generator().manual_seed(1)).tolist()
    logits = PagedRunner(ours, block_size=4).step([("a", ids)])
    torch.testing.assert_close(logits, hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_prefill_then_decode(checkpoint):
    hf, ours = checkpoint
    ids = torch.randint(0, 128, (14,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = PagedRunner(ours, block_size=4)
    got = [runner.step([("a", ids[:9])])]
    for i in range(9, 14):
        got.append(runner.step([("a", [ids[i]])]))
    torch.testing.assert_close(torch.cat(got), hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_batch_of_three_mixed_steps(checkpoint):
    """Three prompts in one flat prefill, then chunked prefill + decodes mixed."""
    hf, ours = checkpoint
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 11, 8)]
    runner = PagedRunner(ours, block_size=4)
    first = runner.step([("a", prompts[0]), ("b", prompts[1][:7]), ("c", prompts[2])])
    refs = [hf_logits(hf, p) for p in prompts]
    torch.testing.assert_close(first[:5], refs[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(first[5:12], refs[1][:7], atol=ATOL, rtol=0)
    torch.testing.assert_close(first[12:], refs[2], atol=ATOL, rtol=0)
    # b finishes its prompt (chunked prefill) while a and c decode one token each.
    a_next, c_next = 7, 9
    second = runner.step([("a", [a_next]), ("b", prompts[1][7:]), ("c", [c_next])])
    torch.testing.assert_close(
        second[0], hf_logits(hf, prompts[0] + [a_next])[-1], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(second[1:5], refs[1][7:], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        second[5], hf_logits(hf, prompts[2] + [c_next])[-1], atol=ATOL, rtol=0
    )


def test_bfloat16_close_to_float32(checkpoint, tmp_path):
    hf, ours = checkpoint
    ours_bf16 = load_model(None, ours.config, torch.bfloat16, load_format="dummy")
    ours_bf16.load_state_dict(
        {k: v.to(torch.bfloat16) for k, v in ours.state_dict().items()}, strict=False
    )
    ids = list(range(3, 15))
    got = PagedRunner(ours_bf16, block_size=16).step([("a", ids)])
    ref = hf_logits(hf, ids)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_registry_rejects_unknown_architecture():
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        get_model_class("GPT2LMHeadModel")
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"} <= set(
        supported_architectures()
    )


def test_gemma3_engine_groups_and_single_layout_agree(tmp_path) -> None:
    """The engine on a tiny Gemma 3 (local window 5): with KV cache groups the local
    layer frees blocks; with disable_hybrid_kv_cache_manager one whole-context table
    serves every layer.  Greedy tokens are the same, and HF picks them too."""
    from minivllm import LLM, SamplingParams

    cfg_name, arch, extra = CASES["gemma3-window"]
    hf, _ = save_random_hf_model(tmp_path, cfg_name, arch, max_position_embeddings=128, **extra)
    prompt = torch.randint(0, 128, (23,), generator=torch.Generator().manual_seed(7)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = {}
    for disable in (False, True):
        llm = LLM(
            model=str(tmp_path),
            dtype="float32",
            skip_tokenizer_init=True,
            optimization_level=0,
            block_size=8,
            max_num_batched_tokens=8,
            num_gpu_blocks_override=64,
            disable_hybrid_kv_cache_manager=disable,
        )
        manager = llm.llm_engine.scheduler.kv_cache_manager
        results[disable] = (
            manager.group_windows,
            llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
            .outputs[0]
            .token_ids,
        )
    assert results[False][0] == (None, 5) and results[True][0] == (None,)
    tokens = list(results[False][1])
    assert tokens == list(results[True][1])
    picks = hf_logits(hf, prompt + tokens)[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert picks == tokens
