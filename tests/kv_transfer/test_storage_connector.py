"""ExampleConnector: a producer writes its prompts' KV blocks to a directory, a consumer
loads them instead of computing them.

- The consumer generates exactly what the producer did (greedy), computing only the
  prompt tokens after the last stored full block.
- A corrupted and a truncated block file are detected by their checksum: a miss (the
  loaded prefix ends there and the rest is computed), deleted, never loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kv_helpers import BLOCK_SIZE, files_in, generate, make_llm, prompts

from minivllm import LLM


def _config(path: Path, role: str) -> dict:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-storage")


@pytest.fixture(scope="module")
def producer(tiny_model: str, storage: Path) -> LLM:
    return make_llm(tiny_model, _config(storage, "kv_producer"))


@pytest.fixture(scope="module")
def consumer(tiny_model: str, storage: Path) -> LLM:
    return make_llm(tiny_model, _config(storage, "kv_consumer"))


def _stats(llm: LLM):  # noqa: ANN202
    return llm.llm_engine.get_stats()


def test_consumer_loads_what_the_producer_stored(producer: LLM, consumer: LLM, storage) -> None:
    items = prompts(4, 45, shared=20, seed=1)
    expected = generate(producer, items)
    # 45 prompt + 5 generated tokens computed: 6 full blocks each, the first 2 shared.
    assert len(files_in(storage)) == 2 + 4 * 4
    assert generate(consumer, items) == expected
    stats = _stats(consumer)
    assert stats.prompt_token_stats.external_kv_transfer == 4 * 5 * BLOCK_SIZE
    assert stats.prompt_token_stats.local_compute == 4 * (45 - 5 * BLOCK_SIZE)
    kv = stats.kv_connector_stats
    assert kv.num_loaded_blocks == 4 * 5 and kv.num_loaded_bytes > 0 and kv.num_failed_loads == 0
    # The consumer writes nothing.
    assert kv.num_saved_blocks == 0 and _stats(producer).kv_connector_stats.num_saved_blocks == 18
    assert consumer.llm_engine.scheduler.kv_cache_manager.get_num_held_blocks() == 0


def test_corrupt_or_truncated_files_are_misses(producer: LLM, consumer: LLM, storage) -> None:
    items = prompts(2, 40, seed=2)  # 4 full blocks loadable each (the last token computed)
    before = set(files_in(storage))
    expected = generate(producer, items)
    new = sorted(set(files_in(storage)) - before)
    assert len(new) == 2 * 5
    by_prompt = _blocks_of(new, items, producer)
    flipped, truncated = by_prompt[0][1], by_prompt[1][2]
    data = bytearray(flipped.read_bytes())
    data[-7] ^= 0x40
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    stats0 = _stats(consumer).kv_connector_stats
    assert generate(consumer, items) == expected
    stats1 = _stats(consumer).kv_connector_stats
    assert stats1.num_corrupt_blocks - stats0.num_corrupt_blocks == 2
    # Prompt 0 loaded its first block only, prompt 1 its first two.
    assert stats1.num_loaded_blocks - stats0.num_loaded_blocks == 1 + 2
    assert not flipped.exists() and not truncated.exists()


def _blocks_of(files: list[Path], items, llm: LLM) -> list[list[Path]]:  # noqa: ANN001
    """Each prompt's block files in block order (named by the prompt's block hashes)."""
    hasher = llm.llm_engine.scheduler.kv_cache_manager.block_hasher
    by_key = {f.name.removesuffix(".kvblock"): f for f in files}
    out = []
    for item in items:
        from minivllm.sampling_params import SamplingParams
        from minivllm.scheduler.request import Request

        request = Request("x", item["prompt_token_ids"], SamplingParams(), block_hasher=hasher)
        out.append([by_key[h.hex()] for h in request.block_hashes if h.hex() in by_key])
    return out
