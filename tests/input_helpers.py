"""An `InputProcessor` over stand-in configs (no model): the engine's one validation
point, for tests that compare its errors with the server's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from minivllm.engine.input_processor import InputProcessor
from minivllm.kv_cache import KVCacheManager
from minivllm.scheduler import Scheduler, SchedulerOptions


class CharTokenizer:
    """One token per character (ids below the vocabulary size)."""

    eos_token_id = 2

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [3 + ord(c) % (self.vocab_size - 3) for c in text]


def make_input_processor(
    max_model_len: int = 32,
    vocab_size: int = 100,
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    model_eos: Any = None,
    **scheduler_options: Any,
) -> InputProcessor:
    model_config = SimpleNamespace(
        max_model_len=max_model_len,
        get_vocab_size=lambda: vocab_size,
        max_logprobs=20,
        hf_text_config=SimpleNamespace(eos_token_id=model_eos),
    )
    config = SimpleNamespace(
        model_config=model_config,
        structured_outputs_config=None,
        speculative_config=None,
        lora_config=None,
        parallel_config=SimpleNamespace(world_size=1),
    )
    options = SchedulerOptions(
        **{"max_num_seqs": 8, "max_num_batched_tokens": 64, **scheduler_options},
        max_model_len=max_model_len,
    )
    manager = KVCacheManager(num_blocks, block_size, max_model_len=max_model_len)
    return InputProcessor(config, CharTokenizer(vocab_size), Scheduler(manager, options))  # type: ignore[arg-type]
