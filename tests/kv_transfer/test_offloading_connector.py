"""OffloadingConnector (``--kv-offloading-size``): a second KV tier behind a KV pool
too small for the working set.

- A second pass over 32 long shared-prefix prompts loads their prefixes back from the
  tier: the prompt tokens computed drop by more than 80%, the outputs are the first
  pass's (greedy), and without the tier they do not drop.
- With a disk directory the tier outlives the engine: a new engine hits it.
- The tier is an LRU within its size: host memory and disk hold at most their blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kv_helpers import files_in, generate, make_llm, prompts

from minivllm import LLM
from minivllm.kv_transfer.layout import KVLayout

NUM_PROMPTS, PROMPT_LEN, SHARED = 32, 49, 16
POOL_BLOCKS = 24  # 32 prompts x 7 blocks do not fit


def _computed(llm: LLM) -> int:
    return llm.llm_engine.get_stats().prompt_token_stats.local_compute


def _two_passes(llm: LLM) -> tuple[list[list[int]], list[list[int]], int, int]:
    items = prompts(NUM_PROMPTS, PROMPT_LEN, shared=SHARED, seed=3)
    first = generate(llm, items)
    computed_first = _computed(llm)
    second = generate(llm, items)
    return first, second, computed_first, _computed(llm) - computed_first


def _offload_llm(model: str, disk: Path | None = None, **extra) -> LLM:  # noqa: ANN003
    config = {"kv_connector_extra_config": {"disk_path": str(disk), **extra}} if disk else None
    return make_llm(
        model,
        kv_transfer_config=config,
        kv_offloading_size=0.01,
        num_gpu_blocks_override=POOL_BLOCKS,
        max_model_len=128,
    )


@pytest.fixture(scope="module")
def baseline(tiny_model: str) -> tuple[list[list[int]], int, int]:
    llm = make_llm(tiny_model, num_gpu_blocks_override=POOL_BLOCKS, max_model_len=128)
    first, second, computed_first, computed_second = _two_passes(llm)
    assert first == second
    return first, computed_first, computed_second


def test_second_pass_hits_the_offload_tier(tiny_model: str, baseline) -> None:  # noqa: ANN001
    expected, base_first, base_second = baseline
    llm = _offload_llm(tiny_model)
    assert llm.llm_engine.vllm_config.kv_transfer_config.kv_connector == "OffloadingConnector"
    first, second, computed_first, computed_second = _two_passes(llm)
    assert first == expected and second == expected
    assert computed_first == base_first
    # Without the tier the pool has lost the prompts; with it, one token each is left.
    assert base_second > 0.8 * base_first
    assert computed_second <= 0.2 * computed_first
    stats = llm.llm_engine.get_stats().kv_connector_stats
    assert stats.num_loaded_blocks >= NUM_PROMPTS * (PROMPT_LEN // 8 - SHARED // 8)
    assert stats.external_hits > 0 and stats.num_corrupt_blocks == 0


def test_disk_tier_survives_a_restart(tiny_model: str, baseline, tmp_path: Path) -> None:  # noqa: ANN001
    expected, base_first, _ = baseline
    items = prompts(NUM_PROMPTS, PROMPT_LEN, shared=SHARED, seed=3)
    llm = _offload_llm(tiny_model, tmp_path)
    assert generate(llm, items) == expected
    del llm
    assert files_in(tmp_path)
    again = _offload_llm(tiny_model, tmp_path)
    assert generate(again, items) == expected
    assert _computed(again) <= 0.2 * base_first


def _block_bytes() -> int:
    from model_helpers import TINY_CONFIG

    head_dim = TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"]
    kv = TINY_CONFIG["num_hidden_layers"] * 2 * 8 * TINY_CONFIG["num_key_value_heads"]
    return kv * head_dim * 4  # float32


def test_tiers_are_lru_within_their_size(tiny_model: str, tmp_path: Path) -> None:
    host_blocks, disk_blocks = 30, 50
    per_block = _block_bytes()
    extra = {
        "cpu_bytes_to_use": host_blocks * per_block,
        "disk_bytes_to_use": disk_blocks * per_block,
        "disk_path": str(tmp_path),
    }
    config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": extra}  # fmt: skip
    llm = make_llm(tiny_model, config, num_gpu_blocks_override=POOL_BLOCKS, max_model_len=128)
    assert KVLayout.from_config(llm.llm_engine.vllm_config).bytes_per_block == per_block
    items = prompts(NUM_PROMPTS, PROMPT_LEN, shared=SHARED, seed=4)
    generate(llm, items)
    worker = llm.llm_engine.executor.worker.model_runner.kv_connector
    assert len(worker.host) == host_blocks
    assert len(files_in(tmp_path)) == disk_blocks
    index = llm.llm_engine.scheduler.remote_kv.connector
    assert len(index.host) == host_blocks and len(index.disk) == disk_blocks
    # The most recently filled blocks are the ones kept: the last prompt's.
    last = llm.llm_engine.scheduler.kv_cache_manager.block_hasher
    from minivllm.sampling_params import SamplingParams
    from minivllm.scheduler.request import Request

    request = Request("r", items[-1]["prompt_token_ids"], SamplingParams(), block_hasher=last)
    assert all(h.hex() in index.host for h in request.block_hashes[SHARED // 8 :])


def test_a_tier_without_room_is_refused(tiny_model: str) -> None:
    config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    with pytest.raises(ValueError, match="holds no block"):
        make_llm(tiny_model, config)
