"""`KVTransferConfig` and the connector ``kv_offloading_size`` resolves into."""

from __future__ import annotations

import pytest

from minivllm.config import CacheConfig, KVTransferConfig, VllmConfig
from minivllm.config.kv_transfer import SUPPORTED_CONNECTORS


def test_offloading_size_resolves_into_an_offloading_connector() -> None:
    cfg = VllmConfig(cache_config=CacheConfig(kv_offloading_size=0.5))
    kv = cfg.kv_transfer_config
    assert kv is not None and kv.kv_connector == "OffloadingConnector"
    assert kv.kv_role == "kv_both" and kv.is_kv_producer and kv.is_kv_consumer
    assert kv.kv_connector_extra_config["cpu_bytes_to_use"] == 0.5 * (1 << 30)
    # A connector runs with one block table per request.
    assert cfg.scheduler_config.disable_hybrid_kv_cache_manager is True
    explained = cfg.explain()["kv_transfer_config.kv_connector"]
    assert "_post_init_kv_transfer_config" in str(explained)


def test_offloading_keeps_the_users_extra_config() -> None:
    kv = KVTransferConfig(kv_connector_extra_config={"disk_path": "/tmp/x"})
    cfg = VllmConfig(cache_config=CacheConfig(kv_offloading_size=1), kv_transfer_config=kv)
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    assert extra == {"disk_path": "/tmp/x", "cpu_bytes_to_use": float(1 << 30)}


def test_lmcache_backend_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="lmcache.*not supported by minivllm.*LMCache"):
        VllmConfig(cache_config=CacheConfig(kv_offloading_size=1, kv_offloading_backend="lmcache"))


@pytest.mark.parametrize("size", [0, -1.5])
def test_offloading_size_must_be_positive(size: float) -> None:
    with pytest.raises(ValueError, match="kv_offloading_size must be a positive"):
        CacheConfig(kv_offloading_size=size)


def test_unknown_connector_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError) as e:
        KVTransferConfig(kv_connector="FooConnector", kv_role="kv_both")
    msg = str(e.value)
    assert "Unknown KV connector 'FooConnector'" in msg
    assert all(name in msg for name in SUPPORTED_CONNECTORS)


@pytest.mark.parametrize("name", ["NixlConnector", "LMCacheConnectorV1", "P2pNcclConnector"])
def test_vllm_connectors_minivllm_cannot_run_say_why(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}' is not supported by minivllm: "):
        KVTransferConfig(kv_connector=name, kv_role="kv_both")


def test_role_is_required_and_checked() -> None:
    with pytest.raises(ValueError, match="kv_role is required"):
        KVTransferConfig(kv_connector="ExampleConnector")
    with pytest.raises(ValueError):
        KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_sender")
    with pytest.raises(ValueError, match="kv_connector_module_path"):
        KVTransferConfig(kv_connector_module_path="my.module")


def test_engine_id_defaults_to_a_uuid_outside_the_hash() -> None:
    a, b = KVTransferConfig(), KVTransferConfig()
    assert a.engine_id and a.engine_id != b.engine_id
    assert a.compute_hash() == b.compute_hash()
    c = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_producer")
    assert c.is_kv_producer and not c.is_kv_consumer and c.compute_hash() != a.compute_hash()


def test_connector_refuses_tensor_parallelism() -> None:
    from minivllm.config import ParallelConfig

    with pytest.raises(ValueError, match="not supported by minivllm yet with tensor"):
        VllmConfig(
            parallel_config=ParallelConfig(tensor_parallel_size=2),
            kv_transfer_config=KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both"),
        )
