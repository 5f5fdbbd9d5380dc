"""SchedulerConfig: platform defaults, token budget rules, hash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.scheduler import SchedulerConfig
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform


def test_cpu_defaults() -> None:
    with override_platform(CpuPlatform()):
        s = SchedulerConfig()
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (128, 2048)
    assert s.enable_chunked_prefill is True
    assert s.policy == "fcfs"
    assert s.async_scheduling is None and s.disable_hybrid_kv_cache_manager is None
    assert s.max_num_scheduled_tokens is None and s.scheduled_token_budget == 2048


def test_cuda_defaults() -> None:
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        s = SchedulerConfig.default_factory()
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (256, 8192)


def test_default_factory_assumes_8192_tokens() -> None:
    s = SchedulerConfig.default_factory()
    assert s.max_model_len == 8192 and s.is_encoder_decoder is False
    assert SchedulerConfig.default_factory(max_model_len=100).max_model_len == 100


def test_user_values_win_over_defaults() -> None:
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        s = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (8, 64)


def test_budget_smaller_than_batch_width_says_how_to_fix() -> None:
    with pytest.raises(ValueError) as e:
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32)
    msg = str(e.value)
    assert "max_num_batched_tokens (32)" in msg and "max_num_seqs (64)" in msg
    assert "Increase max_num_batched_tokens" in msg


def test_without_chunked_prefill_budget_must_hold_a_whole_prompt() -> None:
    with pytest.raises(ValueError) as e:
        SchedulerConfig(
            max_num_batched_tokens=2048, max_model_len=4096, enable_chunked_prefill=False
        )
    assert "Increase max_num_batched_tokens to at least 4096" in str(e.value)


def test_without_chunked_prefill_unset_budget_grows_to_max_model_len() -> None:
    with override_platform(CpuPlatform()):
        s = SchedulerConfig(max_model_len=8192, enable_chunked_prefill=False)
    assert s.max_num_batched_tokens == 8192


def test_unset_batch_width_is_capped_at_the_users_budget() -> None:
    # vLLM: a max_num_seqs the user did not set never exceeds max_num_batched_tokens.
    with override_platform(CpuPlatform()):
        s = SchedulerConfig(max_num_batched_tokens=64, max_model_len=8192)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (64, 64)
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        assert SchedulerConfig(max_num_batched_tokens=100).max_num_seqs == 100


def test_unset_budget_is_capped_at_what_the_batch_can_use() -> None:
    # vLLM: a default budget never exceeds max_num_seqs * max_model_len ...
    with override_platform(CpuPlatform()):
        s = SchedulerConfig(max_model_len=4)
        assert (s.max_num_seqs, s.max_num_batched_tokens) == (128, 512)
        assert SchedulerConfig(max_num_seqs=2, max_model_len=32).max_num_batched_tokens == 64
        # ... and is raised to max_model_len without chunked prefill (before the cap).
        unchunked = SchedulerConfig(
            max_num_seqs=2, max_model_len=4096, enable_chunked_prefill=False
        )
        assert unchunked.max_num_batched_tokens == 4096


def test_unset_budget_makes_room_for_the_users_batch_width() -> None:
    with override_platform(CpuPlatform()):
        s = SchedulerConfig(max_num_seqs=4096, max_model_len=8192)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (4096, 4096)


def test_chunked_prefill_allows_small_budget() -> None:
    s = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=8192)
    assert s.max_num_batched_tokens == 512


def test_verify_max_model_len_can_be_called_later() -> None:
    s = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=8, enable_chunked_prefill=False)
    s.verify_max_model_len(1024)
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        s.verify_max_model_len(2048)


def test_priority_policy_and_invalid_policy() -> None:
    assert SchedulerConfig(policy="priority").policy == "priority"
    with pytest.raises(ValueError):
        SchedulerConfig(policy="lifo")  # type: ignore[arg-type]


def test_custom_scheduler_class_is_unsupported() -> None:
    with pytest.raises(ValueError, match="not supported by minivllm"):
        SchedulerConfig(scheduler_cls="my.Scheduler")


def test_partial_prefills() -> None:
    s = SchedulerConfig(max_num_partial_prefills=2, max_model_len=10_000)
    assert s.long_prefill_token_threshold == 400  # 4% of max_model_len
    with pytest.raises(ValueError, match="needs chunked prefill"):
        SchedulerConfig(
            max_num_partial_prefills=2,
            max_model_len=1000,
            max_num_batched_tokens=4096,
            enable_chunked_prefill=False,
        )
    with pytest.raises(ValueError, match="max_long_partial_prefills"):
        SchedulerConfig(max_num_partial_prefills=2, max_long_partial_prefills=3, max_model_len=100)


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens", "stream_interval"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{field: 0})


def test_hash_has_no_factors() -> None:
    a = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, policy="priority")
    assert a.compute_hash() == SchedulerConfig().compute_hash()


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.integers(1, 20_000),
    seqs=st.integers(1, 1024),
    max_len=st.integers(1, 20_000),
    chunked=st.booleans(),
)
def test_budget_rule_property(tokens: int, seqs: int, max_len: int, chunked: bool) -> None:
    valid = tokens >= seqs and (chunked or tokens >= max_len)
    kwargs = dict(
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        max_model_len=max_len,
        enable_chunked_prefill=chunked,
    )
    if valid:
        s = SchedulerConfig(**kwargs)
        assert s.max_num_batched_tokens == tokens
    else:
        with pytest.raises(ValueError):
            SchedulerConfig(**kwargs)
