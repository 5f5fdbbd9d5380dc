"""LoRA adapters served by minivllm against Hugging Face transformers + peft: greedy
tokens identical and log-probabilities close, each adapter alone and one batch that
mixes the base model and three adapters of different ranks and target modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora_helpers import check_output, peft_reference, save_peft_adapter
from model_helpers import save_random_hf_model

from minivllm import LLM, SamplingParams
from minivllm.lora.request import LoRARequest

ADAPTERS = {
    # name: (rank, target modules, extra PEFT options)
    "attn_qv": (4, ["q_proj", "v_proj"], {}),
    "mlp_o": (8, ["o_proj", "down_proj", "up_proj"], {}),
    "all_rs": (
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        {"use_rslora": True},
    ),
}
NUM_TOKENS = 6
PROMPT = list(range(3, 40))  # over two KV blocks of 16: the prefix cache has full blocks


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    hf, _ = save_random_hf_model(tmp / "base", tie_word_embeddings=False)
    refs: dict[str | None, torch.nn.Module] = {None: hf}
    requests: dict[str | None, LoRARequest | None] = {None: None}
    for i, (name, (rank, targets, extra)) in enumerate(ADAPTERS.items(), start=1):
        path = tmp / name
        refs[name] = save_peft_adapter(hf, path, r=rank, target_modules=targets, seed=i, **extra)
        requests[name] = LoRARequest(name, i, str(path))
    return make_llm(tmp / "base", max_loras=3), refs, requests, tmp


def make_llm(path: Path, level: int = 0, **overrides: int) -> LLM:
    """An engine over the tiny model at ``path``, float32, LoRA on (eager by default)."""
    kwargs = {"num_gpu_blocks_override": 64, "max_lora_rank": 16, **overrides}
    return LLM(
        model=str(path),
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=level,
        enable_lora=True,
        **kwargs,
    )


def reference(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities from the HF (peft) model."""
    return peft_reference(model, prompt, NUM_TOKENS)


check = check_output


PARAMS = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, logprobs=1)


def check_batch(llm: LLM, served, names: list[str | None], prompt: list[int]) -> None:
    """``prompt`` under each adapter of ``names`` (None: the base), as one batch."""
    _, refs, requests, _ = served
    outs = llm.generate(
        [{"prompt_token_ids": prompt}] * len(names),
        PARAMS,
        use_tqdm=False,
        lora_request=[requests[n] for n in names],
    )
    for out, name in zip(outs, names, strict=True):
        check(out, reference(refs[name], prompt))


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_alone_matches_peft(served, name) -> None:
    llm, refs, requests, _ = served
    want = reference(refs[name], PROMPT)
    assert want[0] != reference(refs[None], PROMPT)[0], "the adapter must change the output"
    (out,) = llm.generate(
        {"prompt_token_ids": PROMPT}, PARAMS, use_tqdm=False, lora_request=requests[name]
    )
    check(out, want)


def test_one_batch_mixing_base_and_three_adapters_matches_peft(served) -> None:
    llm, refs, requests, _ = served
    names = [None, *ADAPTERS, None, "attn_qv"]
    # Different prompts per row (and the same prompt under different adapters).
    prompts = [PROMPT[i % 3 :] for i in range(len(names))]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        PARAMS,
        use_tqdm=False,
        lora_request=[requests[n] for n in names],
    )
    for out, name, prompt in zip(outs, names, prompts, strict=True):
        check(out, reference(refs[name], prompt))


def test_prefix_cache_never_shares_blocks_across_adapters(served) -> None:
    llm, refs, requests, _ = served
    # Same prompt, one adapter after the other: a shared block would carry the KV of
    # the previous adapter and change the logits.
    for name in [None, "all_rs", "mlp_o", None]:
        (out,) = llm.generate(
            {"prompt_token_ids": PROMPT}, PARAMS, use_tqdm=False, lora_request=requests[name]
        )
        check(out, reference(refs[name], PROMPT))
    assert out.num_cached_tokens and out.num_cached_tokens >= 16  # the base's blocks reused


def test_more_adapters_than_max_loras_wait_and_all_finish(served) -> None:
    tmp = served[3]
    llm = make_llm(tmp / "base", max_loras=1, max_cpu_loras=2)
    check_batch(llm, served, [*ADAPTERS, None, *ADAPTERS], PROMPT)


def test_preempted_and_chunked_requests_keep_their_adapter(served) -> None:
    tmp = served[3]
    # Prefill chunks of 16 tokens, admitted without reserving the whole prompt, in 8
    # usable blocks of 16 for four 47-token prompts: preemptions, also mid-prefill.
    llm = make_llm(
        tmp / "base",
        max_loras=3,
        num_gpu_blocks_override=9,
        max_num_batched_tokens=16,
        scheduler_reserve_full_isl=False,
    )
    check_batch(llm, served, [None, *ADAPTERS], list(range(3, 50)))
    assert llm.llm_engine.scheduler.num_preemptions > 0


def _copy_adapter(src: Path, dst: Path, **config_changes) -> Path:
    import json
    import shutil

    shutil.copytree(src, dst)
    config_file = dst / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(config_changes)
    config_file.write_text(json.dumps(config))
    return dst


def test_bad_adapters_are_refused_with_the_reason(served, tmp_path) -> None:
    llm, _, requests, tmp = served
    src = tmp / "attn_qv"
    other_hf, _ = save_random_hf_model(
        tmp_path / "other", hidden_size=32, tie_word_embeddings=False
    )
    save_peft_adapter(other_hf, tmp_path / "other_lora", r=4, target_modules=["q_proj"], seed=0)
    cases = [
        (tmp_path / "missing", "has no adapter_config.json"),
        (_copy_adapter(src, tmp_path / "dora", use_dora=True), "DoRA"),
        (_copy_adapter(src, tmp_path / "save", modules_to_save=["lm_head"]), "modules_to_save"),
        (_copy_adapter(src, tmp_path / "embed", target_modules=["embed_tokens"]), "embed_tokens"),
        (tmp_path / "other_lora", "trained for another base model"),
    ]
    for i, (path, words) in enumerate(cases, start=10):
        with pytest.raises(ValueError, match=words):
            llm.generate(
                {"prompt_token_ids": PROMPT},
                PARAMS,
                use_tqdm=False,
                lora_request=LoRARequest(f"bad{i}", i, str(path)),
            )
    rank32 = tmp_path / "rank32"
    save_peft_adapter(other_hf, rank32, r=32, target_modules=["q_proj"], seed=0)
    with pytest.raises(ValueError, match="rank 32, above max_lora_rank=16"):
        llm.generate(
            {"prompt_token_ids": PROMPT}, PARAMS, lora_request=LoRARequest("r", 20, str(rank32))
        )
    # The engine still serves its adapters afterwards.
    (out,) = llm.generate(
        {"prompt_token_ids": PROMPT}, PARAMS, use_tqdm=False, lora_request=requests["attn_qv"]
    )
    assert out.outputs[0].token_ids


def test_lora_request_needs_enable_lora(tmp_path) -> None:
    save_random_hf_model(tmp_path, tie_word_embeddings=False)
    llm = LLM(
        model=str(tmp_path),
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=0,
        num_gpu_blocks_override=16,
    )
    with pytest.raises(ValueError, match="LoRA is off; start the engine with enable_lora=True"):
        llm.generate(
            {"prompt_token_ids": [1, 2, 3]}, lora_request=LoRARequest("a", 1, str(tmp_path))
        )


@pytest.mark.slow  # compiles the model (VLLM_COMPILE); the eager tests cover the LoRA math
def test_compiled_forward_mixing_adapters_matches_peft(served) -> None:
    tmp = served[3]
    llm = make_llm(tmp / "base", level=2, max_loras=3)
    check_batch(llm, served, [None, *ADAPTERS], PROMPT)
