"""Engine-side defences, in process: a request whose own inputs break the worker fails
alone, and an engine never starts on a KV cache that cannot hold max_model_len.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from minivllm import LLM, SamplingParams
from minivllm.args.engine_args import EngineArgs
from minivllm.engine.async_llm import AsyncLLM, EngineError
from minivllm.engine.llm_engine import LLMEngine
from minivllm.executor.uniproc import check_kv_cache_holds_max_model_len
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind

COMMON: dict[str, Any] = dict(dtype="float32", optimization_level=0)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def llm() -> LLM:
    """A fresh engine per test: a test that failed must not leave requests behind."""
    return LLM(num_gpu_blocks_override=64, max_model_len=256, **COMMON)


def _poisoned(n: int = 1, output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY) -> Any:
    """Params whose seed torch.Generator refuses: changed after validation, the way a
    caller can mutate a SamplingParams (the engine must survive what validation missed)."""
    params = SamplingParams(n=n, temperature=1.0, seed=1, max_tokens=8, output_kind=output_kind)
    params.seed = 2**64
    return params


def _run(engine: LLMEngine) -> dict[str, RequestOutput]:
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    return finals


def test_request_whose_generator_cannot_be_built_fails_alone(llm: LLM) -> None:
    engine = llm.llm_engine
    manager = engine.scheduler.kv_cache_manager
    engine.add_request("fine", "The capital of France is", GREEDY)
    engine.add_request("bad", "Hello", _poisoned())
    engine.add_request("bad-n2", "Hello there", _poisoned(n=2))
    engine.add_request("fine-too", "1, 2, 3,", GREEDY)
    finals = _run(engine)
    for rid in ("fine", "fine-too"):
        assert finals[rid].error is None
        assert finals[rid].outputs[0].finish_reason == "length"
        assert len(finals[rid].outputs[0].token_ids) == 8
    for rid, n in (("bad", 1), ("bad-n2", 2)):
        assert "Overflow" in (finals[rid].error or "")
        assert [c.finish_reason for c in finals[rid].outputs] == ["error"] * n
    # Nothing is left behind: every block is back, the worker forgot the failed ones.
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
    assert engine.output_processor.states == {} and engine.output_processor.parents == {}
    again = llm.generate("The capital of France is", GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == finals["fine"].outputs[0].token_ids


def _nan_params() -> list[SamplingParams]:
    """Params whose logits turn NaN in the sampler (changed after validation, which
    refuses these values): an infinite temperature over masked (-inf) tokens, and a NaN
    bias on a greedy row."""
    hot = SamplingParams(temperature=1.0, allowed_token_ids=[5, 6], max_tokens=8)
    hot.temperature = float("inf")
    biased = SamplingParams(temperature=0.0, logit_bias={5: 1.0}, max_tokens=8)
    biased.logit_bias = {5: float("nan")}
    return [hot, biased]


def test_request_whose_logits_turn_nan_fails_alone(llm: LLM) -> None:
    engine = llm.llm_engine
    manager = engine.scheduler.kv_cache_manager
    engine.add_request("fine", "The capital of France is", GREEDY)
    for i, params in enumerate(_nan_params()):
        engine.add_request(f"nan-{i}", "Hello", params)
    finals = _run(engine)
    assert finals["fine"].error is None and len(finals["fine"].outputs[0].token_ids) == 8
    for rid in ("nan-0", "nan-1"):
        assert "NaN" in (finals[rid].error or ""), finals[rid]
        assert finals[rid].outputs[0].finish_reason == "error"
        assert finals[rid].outputs[0].token_ids == []  # no garbage token went out
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
    assert engine.output_processor.states == {}


def test_failing_request_ends_its_own_stream_only(llm: LLM) -> None:
    async_llm = AsyncLLM(llm.llm_engine)
    delta = SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )

    async def collect(rid: str, prompt: str, params: SamplingParams) -> int:
        num_tokens = 0
        async for output in async_llm.generate(prompt, params, rid):
            num_tokens += len(output.outputs[0].token_ids)
        return num_tokens

    async def main() -> list[Any]:
        running = asyncio.create_task(collect("running", "Once upon a time", delta))
        await asyncio.sleep(0.3)  # it is decoding when the bad one arrives
        bad = asyncio.create_task(collect("bad", "Hello", _poisoned(2, RequestOutputKind.DELTA)))
        both = asyncio.gather(running, bad, return_exceptions=True)
        return await asyncio.wait_for(both, 60)

    try:
        num_tokens, error = asyncio.run(main())
    finally:
        async_llm.shutdown()
    assert num_tokens == 16
    assert isinstance(error, EngineError) and "Overflow" in str(error)
    assert not async_llm.errored


# -- the KV cache must hold max_model_len ---------------------------------------------
def test_explicit_max_model_len_beyond_the_kv_cache_is_refused() -> None:
    config = EngineArgs(max_model_len=2048, block_size=16).create_engine_config()
    with pytest.raises(ValueError) as info:
        check_kv_cache_holds_max_model_len(config, 65, "num_gpu_blocks_override")
    message = str(info.value)
    for part in ("max_model_len=2048", "1024 tokens", "65 blocks", "--num-gpu-blocks-override",
                 "--max-model-len to 1024"):  # fmt: skip
        assert part in message, message
    assert config.model_config.max_model_len == 2048


def test_default_max_model_len_is_lowered_to_the_kv_cache() -> None:
    config = EngineArgs(block_size=16).create_engine_config()
    assert config.model_config.max_model_len > 1024
    check_kv_cache_holds_max_model_len(config, 65, "num_gpu_blocks_override")
    assert config.model_config.max_model_len == 1024
    check_kv_cache_holds_max_model_len(config, 65, "num_gpu_blocks_override")  # fits now


def test_llm_refuses_to_start_on_a_kv_cache_too_small_for_max_model_len() -> None:
    with pytest.raises(ValueError, match="--num-gpu-blocks-override"):
        LLM(num_gpu_blocks_override=16, max_model_len=2048, **COMMON)
    small = LLM(num_gpu_blocks_override=16, **COMMON)
    assert small.llm_engine.model_config.max_model_len == 15 * 16
    assert small.llm_engine.scheduler.options.max_model_len == 15 * 16
