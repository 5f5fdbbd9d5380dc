"""The communicator's collectives on a real one-rank gloo group, and the sharding
rules that need no second process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from minivllm.distributed import (
    destroy_distributed_environment,
    get_pp_group,
    get_tp_group,
    get_world_group,
    init_distributed_environment,
    initialize_model_parallel,
)
from minivllm.distributed.parallel_state import local_device
from minivllm.executor.multiproc import free_local_port


def exercise_collectives(device: torch.device) -> None:
    """What every layer relies on, on a one-rank group of ``device``'s backend."""
    tp = get_tp_group()
    assert tp.world_size == 1 and tp.device_group is not None
    x = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
    reduced = tp.all_reduce(x)
    assert torch.equal(reduced, x) and reduced.data_ptr() != x.data_ptr()
    assert torch.equal(tp.all_gather(x, dim=-1), x)
    assert torch.equal(tp.all_gather(x, dim=0), x)
    tokens = torch.tensor([5, 7], device=device)
    assert torch.equal(get_world_group().broadcast(tokens, src=0), tokens)
    # The ops are visible to torch.compile as opaque calls (no graph break).
    compiled = torch.compile(lambda t: tp.all_reduce(t * 2) + 1, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), x * 2 + 1)
    pp = get_pp_group()
    assert pp.is_first_rank and pp.is_last_rank


@pytest.fixture
def gloo_world() -> Iterator[None]:
    init_distributed_environment(1, 0, f"tcp://127.0.0.1:{free_local_port()}", "gloo")
    initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        destroy_distributed_environment()


def test_gloo_collectives_with_world_size_1(gloo_world: None) -> None:
    exercise_collectives(local_device("cpu", 0))


def test_groups_are_single_rank_no_ops_before_start_up() -> None:
    tp = get_tp_group()
    assert tp.world_size == 1 and tp.device_group is None
    x = torch.ones(3)
    assert tp.all_reduce(x) is x and tp.all_gather(x) is x


def test_group_sizes_must_multiply_to_the_world(gloo_world: None) -> None:
    with pytest.raises(ValueError, match="!= world size 1"):
        initialize_model_parallel(2, 1)


def test_kv_heads_must_replicate_evenly() -> None:
    from minivllm.config.parallel import ParallelConfig
    from minivllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(load_format="dummy").create_engine_config()
    model = cfg.model_config
    assert (model.num_attention_heads, model.num_kv_heads) == (9, 3)
    model.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=3))
    for tp in (2, 4):
        with pytest.raises(ValueError, match="cannot be"):
            model.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=tp))
