"""LoRA under tensor parallelism (TP=2 on the "mp" executor, gloo) gives one process's
and HF transformers + peft's greedy tokens and log-probabilities, with
``fully_sharded_loras`` off and on.

The tiny Llama has one KV head, replicated on both ranks (each rank's k/v slice of B
is that head's); the two adapters differ in rank and targets: one of the maximum
rank on every projection (with ``fully_sharded_loras`` each rank holds half of its
A), one of a lower rank on q/v and down_proj.  One batch mixes the base model and
both adapters; adapters reach every rank with their first request, and a removed
adapter leaves every rank.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import ENGINE
from lora_helpers import check_output, peft_reference, save_peft_adapter
from model_helpers import save_random_hf_model

from minivllm import LLM, SamplingParams
from minivllm.lora.request import LoRARequest

ADAPTERS = {
    # name: (id, rank, target modules, extra PEFT options)
    "full": (
        1,
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        {"use_rslora": True},
    ),
    "qv_down": (2, 8, ["q_proj", "v_proj", "down_proj"], {}),
}
NUM_TOKENS = 6
PARAMS = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, logprobs=1)
NAMES: list[str | None] = [None, "full", "qv_down", None, "full"]
PROMPTS = [list(range(3 + i, 30 + 3 * i)) for i in range(len(NAMES))]
LORA = dict(enable_lora=True, max_loras=2, max_lora_rank=16)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The base checkpoint, each name's peft reference per prompt, and the requests."""
    tmp = tmp_path_factory.mktemp("lora_tp")
    hf, _ = save_random_hf_model(tmp / "base", num_key_value_heads=1, tie_word_embeddings=False)
    models: dict[str | None, torch.nn.Module] = {None: hf}
    requests: dict[str | None, LoRARequest | None] = {None: None}
    for name, (lora_id, rank, targets, extra) in ADAPTERS.items():
        models[name] = save_peft_adapter(
            hf, tmp / name, r=rank, target_modules=targets, seed=lora_id, **extra
        )
        requests[name] = LoRARequest(name, lora_id, str(tmp / name))
    refs = [peft_reference(models[n], p, NUM_TOKENS) for n, p in zip(NAMES, PROMPTS, strict=True)]
    for i in (1, 2):  # each adapter changes the base model's tokens
        assert refs[i][0] != peft_reference(hf, PROMPTS[i], NUM_TOKENS)[0]
    return {"path": tmp / "base", "refs": refs, "requests": requests}


def _generate(llm: LLM, served: dict[str, Any], names: list[str | None], prompts: list) -> list:
    return llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        PARAMS,
        use_tqdm=False,
        lora_request=[served["requests"][n] for n in names],
    )


def _tokens_and_logprobs(output: Any) -> tuple[list[int], list[float]]:
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    return tokens, [e[t].logprob for e, t in zip(completion.logprobs, tokens, strict=True)]


@pytest.fixture(scope="module")
def one_process(served: dict[str, Any]) -> list[Any]:
    """The TP=1 LoRA engine's outputs of the mixed batch."""
    llm = LLM(model=str(served["path"]), **ENGINE, **LORA)
    return _generate(llm, served, NAMES, PROMPTS)


@pytest.fixture(scope="module", params=[False, True], ids=["half_sharded", "fully_sharded"])
def tp2(request: pytest.FixtureRequest, served: dict[str, Any]):  # noqa: ANN201
    llm = LLM(
        model=str(served["path"]),
        tensor_parallel_size=2,
        fully_sharded_loras=request.param,
        **ENGINE,
        **LORA,
    )
    yield llm
    llm.llm_engine.shutdown()


def test_tp2_mixed_batch_matches_one_process_and_peft(tp2: LLM, served, one_process) -> None:
    assert tp2.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    outs = _generate(tp2, served, NAMES, PROMPTS)
    for out, single, want in zip(outs, one_process, served["refs"], strict=True):
        check_output(out, want)  # HF transformers + peft
        check_output(out, _tokens_and_logprobs(single), tol=1e-4)  # the TP=1 engine


def test_adapters_are_added_and_removed_on_every_rank(tp2: LLM, served) -> None:
    engine = tp2.llm_engine
    _generate(tp2, served, ["qv_down", "full"], PROMPTS[:2])
    assert engine.executor.collective_rpc("list_loras") == [[1, 2], [1, 2]]
    assert engine.remove_lora(1)
    _generate(tp2, served, [None], PROMPTS[:1])  # the next step carries the removal
    assert engine.executor.collective_rpc("list_loras") == [[2], [2]]
    # Served again after its removal: read from disk anew on both ranks.
    (out,) = _generate(tp2, served, ["full"], PROMPTS[1:2])
    check_output(out, served["refs"][1])
    assert engine.executor.collective_rpc("list_loras") == [[1, 2], [1, 2]]
