"""The nccl path: the communicator's collectives on a one-rank nccl group, and an
engine on the "mp" executor with TP=1 (its one rank joins an nccl group)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "distributed"))
from dist_helpers import ENGINE, greedy_tokens, reference_tokens, save_tiny  # noqa: E402
from test_communicator import exercise_collectives  # noqa: E402

from minivllm import LLM  # noqa: E402
from minivllm.distributed import (  # noqa: E402
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from minivllm.distributed.parallel_state import local_device  # noqa: E402
from minivllm.executor.multiproc import free_local_port  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def nccl_world() -> Iterator[None]:
    init_distributed_environment(1, 0, f"tcp://127.0.0.1:{free_local_port()}", "nccl")
    initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        destroy_distributed_environment()


def test_nccl_collectives_with_world_size_1(nccl_world: None) -> None:
    exercise_collectives(local_device("cuda", 0))
    assert torch.distributed.get_backend() == "nccl"


def test_mp_executor_with_tp1_on_nccl(tmp_path: Path) -> None:
    path = save_tiny(tmp_path, "llama")
    expected = reference_tokens(path)
    llm = LLM(model=str(path), distributed_executor_backend="mp", **ENGINE)
    try:
        assert greedy_tokens(llm) == expected
    finally:
        llm.llm_engine.shutdown()
