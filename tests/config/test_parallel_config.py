"""ParallelConfig: tensor and pipeline parallel over the mp/ray executors; the rest is refused."""

from __future__ import annotations

import pytest

from minivllm.config.parallel import ParallelConfig


def test_defaults() -> None:
    p = ParallelConfig()
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (1, 1, 1)
    assert p.world_size == 1 and p.world_size_across_dp == 1
    assert p.distributed_executor_backend == "uni"
    assert not p.use_ubatching and not p.use_all2all
    assert p.rank == 0 and p.data_parallel_index == 0


def test_tensor_parallel_defaults_to_mp() -> None:
    p = ParallelConfig(tensor_parallel_size=2)
    assert p.distributed_executor_backend == "mp"
    assert p.world_size == 2


def test_tensor_parallel_with_mp_is_accepted() -> None:
    p = ParallelConfig(tensor_parallel_size=4, distributed_executor_backend="mp")
    assert p.world_size == 4


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_tensor_and_pipeline_parallel_run_on_both_executors(backend: str) -> None:
    p = ParallelConfig(
        tensor_parallel_size=3,
        pipeline_parallel_size=2,
        distributed_executor_backend=backend,  # type: ignore[arg-type]
    )
    assert p.world_size == 6


def test_pipeline_parallel_defaults_to_mp() -> None:
    assert ParallelConfig(pipeline_parallel_size=2).distributed_executor_backend == "mp"


@pytest.mark.parametrize("field", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_more_than_one_rank_needs_processes(field: str) -> None:
    with pytest.raises(ValueError, match="use 'mp' or 'ray'"):
        ParallelConfig(**{field: 2}, distributed_executor_backend="uni")  # type: ignore[arg-type]


def test_data_parallel_runs_every_replica_here_by_default() -> None:
    p = ParallelConfig(data_parallel_size=2)
    assert p.internal_data_parallel and p.data_parallel_size_local == 2
    assert p.world_size == 1 and p.world_size_across_dp == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"data_parallel_size": 2, "data_parallel_rank": 2}, "use 0 to 1"),
        ({"data_parallel_backend": "slurm"}, "'mp' or 'ray'"),
        ({"data_parallel_size": 4, "data_parallel_size_local": 2}, "--data-parallel-backend ray"),
        ({"data_parallel_rpc_port": 70000}, "TCP port"),
        ({"data_parallel_prefix_routing_slack": -1}, ">= 0"),
    ],
)
def test_bad_data_parallel_settings_say_why(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ParallelConfig(**kwargs)


def test_external_load_balancing_is_one_replica() -> None:
    p = ParallelConfig(data_parallel_size=2, data_parallel_rank=1, data_parallel_external_lb=True)
    assert not p.internal_data_parallel and p.data_parallel_index == 1


def test_single_rank_backends() -> None:
    for backend in ("uni", "mp", "ray"):
        assert ParallelConfig(distributed_executor_backend=backend).world_size == 1  # type: ignore[arg-type]


def test_external_launcher_is_unsupported() -> None:
    with pytest.raises(ValueError, match="external_launcher"):
        ParallelConfig(distributed_executor_backend="external_launcher")


@pytest.mark.parametrize(
    ("field", "what"),
    [
        ("decode_context_parallel_size", "decode context parallelism"),
        ("prefill_context_parallel_size", "prefill context parallelism"),
    ],
)
def test_other_parallelism_is_not_supported_yet(field: str, what: str) -> None:
    with pytest.raises(ValueError) as e:
        ParallelConfig(**{field: 2})
    assert "not supported by minivllm yet" in str(e.value)
    assert what in str(e.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable_expert_parallel": True},
        {"enable_eplb": True},
        {"enable_dbo": True},
        {"ubatch_size": 2},
        {"enable_fault_tolerance": True},
        {"enable_batch_sharded_sampling": True},
        {"worker_cls": "my.Worker"},
    ],
)
def test_unsupported_features(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="not supported by minivllm"):
        ParallelConfig(**kwargs)


@pytest.mark.parametrize("field", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        ParallelConfig(**{field: 0})


def test_check_supported_sees_later_assignments() -> None:
    p = ParallelConfig()
    p.decode_context_parallel_size = 2
    with pytest.raises(ValueError, match="decode context parallelism"):
        p.check_supported()


def test_hash_factors() -> None:
    base = ParallelConfig().compute_hash()
    assert ParallelConfig(tensor_parallel_size=2).compute_hash() != base
    # Which executor runs one rank, and the rank itself, do not shape the graph.
    assert ParallelConfig(distributed_executor_backend="mp").compute_hash() == base
    assert ParallelConfig(rank=3, max_parallel_loading_workers=2).compute_hash() == base


def test_set_dcp_defaults_copies_the_deprecated_alias() -> None:
    p = ParallelConfig(dcp_kv_cache_interleave_size=4)
    p.set_dcp_defaults()
    assert p.cp_kv_cache_interleave_size == 4


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"numa_bind": True}, "numa_bind=True (NUMA binding; use False)"),
        ({"data_parallel_hybrid_lb": True}, "data_parallel_hybrid_lb=True (data-parallel"),
        ({"dbo_decode_token_threshold": 8}, "(dual batch overlap; use 32)"),
        ({"distributed_timeout_seconds": 60}, "distributed_timeout_seconds=60"),
        ({"eplb_config": {"window_size": 5}}, "eplb_config={'window_size': 5} (expert load"),
        ({"placement_group": object()}, "placement_group="),
    ],
)
def test_vllm_fields_minivllm_lacks_get_its_message(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        ParallelConfig(**kwargs)
    assert "not supported by minivllm yet: " in str(e.value) and needle in str(e.value)
    assert "Unexpected keyword argument" not in str(e.value)


def test_vllm_fields_at_their_defaults_are_accepted() -> None:
    p = ParallelConfig(
        nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29501, eplb_config=None
    )
    assert p.nnodes == 1 and p.check_supported() is None
    with pytest.raises(ValueError, match="Unexpected keyword argument"):
        ParallelConfig(nnodez=2)  # type: ignore[call-arg]  # a typo, not a vLLM field


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"enable_lora": True}, "LoRA"),
        ({"runner": "pooling"}, "pooling models"),
        ({"kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}},
         "KV connector"),
        ({"kv_events_config": {"enable_kv_cache_events": True}}, "KV cache events"),
    ],
)  # fmt: skip
def test_internal_data_parallel_refuses_what_its_replicas_cannot_route(
    kwargs: dict, needle: str
) -> None:
    from minivllm.engine.arg_utils import EngineArgs

    with pytest.raises(ValueError, match=needle) as err:
        EngineArgs(data_parallel_size=2, **kwargs).create_engine_config()
    assert "--data-parallel-rank" in str(err.value)
    # One replica per server (external load balancing) runs them.
    EngineArgs(
        data_parallel_size=2, data_parallel_rank=1, data_parallel_master_ip="10.0.0.1", **kwargs
    ).create_engine_config()
