"""Data parallelism without engines: the routing rule, the core split, the flags.

The balancer is checked against vLLM's rule written out here independently (least
``waiting * 4 + running``, counting what was routed since the last report)."""

from __future__ import annotations

import json
import os
import random

import pytest

from minivllm.engine.dp_balancer import LoadBalancer, block_hashes
from minivllm.entrypoints.cli.main import main
from minivllm.platforms import cpu as cpu_platform


def _reference_choice(loads: list[tuple[int, int, int]], alive: list[bool]) -> set[int]:
    """Every replica with the least (waiting + routed) * 4 + running among the live ones."""
    scores = {i: (w + r) * 4 + run for i, (w, run, r) in enumerate(loads) if alive[i]}
    best = min(scores.values())
    return {i for i, s in scores.items() if s == best}


def test_least_loaded_matches_vllms_rule_on_random_loads() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 5)
        balancer = LoadBalancer(n, block_size=16)
        loads = []
        for i in range(n):
            waiting, running, routed = rng.randint(0, 6), rng.randint(0, 20), rng.randint(0, 3)
            balancer.report(i, waiting, running)
            balancer.counts[i].num_routed = routed
            loads.append((waiting, running, routed))
        alive = [rng.random() > 0.2 for _ in range(n)]
        if not any(alive):
            alive[0] = True
        assert balancer.choose([1, 2, 3], alive) in _reference_choice(loads, alive)


def test_a_burst_spreads_before_any_report() -> None:
    balancer = LoadBalancer(2, block_size=16)
    picks = [balancer.choose([1] * 5, [True, True]) for _ in range(8)]
    assert picks.count(0) == picks.count(1) == 4
    # An add acknowledged by replica 0 with its real load replaces the routed count.
    balancer.added(0, num_waiting=0, num_running=4)
    assert balancer.counts[0].score == 3 * 4 + 4


def test_dead_replicas_get_nothing_and_none_alive_is_an_error() -> None:
    balancer = LoadBalancer(3, block_size=16)
    assert {balancer.choose([1], [False, True, False]) for _ in range(5)} == {1}
    with pytest.raises(ValueError, match="no live"):
        balancer.choose([1], [False, False, False])


def test_block_hashes_chain_over_full_blocks_only() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [99] * 8, 16)
    c = block_hashes([7] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b  # the partial third block is not hashed
    assert c[0] != a[0] and c[1] != a[1]  # a changed first block changes every hash after


def test_prefix_aware_routing_follows_the_prefix_within_the_slack() -> None:
    shared = list(range(64))
    balancer = LoadBalancer(2, block_size=16, prefix_aware=True, slack=8)
    first = balancer.choose(shared + [500], [True, True])
    # Same prefix again: it goes to the holder although the other replica is idler.
    assert balancer.choose(shared + [501], [True, True]) == first
    # Beyond the slack the least loaded replica wins.
    balancer.report(first, num_waiting=3, num_running=0)
    assert balancer.choose(shared + [502], [True, True]) != first


def test_least_loaded_routing_ignores_prefixes() -> None:
    shared = list(range(64))
    balancer = LoadBalancer(2, block_size=16)
    assert [balancer.choose(shared + [i], [True, True]) for i in range(4)] == [0, 1, 0, 1]


def test_more_replicas_than_cores_warns_and_gives_one_thread_each(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("MINIVLLM_CPU_THREADS", raising=False)
    sets, threads, warning = cpu_platform.data_parallel_cpu_sets(3)
    assert sets == [[0], [1], [0]] and threads == 1
    assert warning is not None and "-dp 2 or fewer" in warning
    sets, threads, warning = cpu_platform.data_parallel_cpu_sets(2)
    assert sets == [[0], [1]] and threads == 1 and warning is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("MINIVLLM_CPU_THREADS", "6")
    assert cpu_platform.data_parallel_cpu_sets(2) == ([[0, 1, 2, 3], [4, 5, 6, 7]], 3, None)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["config", "-dp", "2", "--data-parallel-rank", "1"], "needs --data-parallel-address"),
        (["config", "-dp", "2", "--data-parallel-backend", "slurm"], "invalid choice"),
        (["config", "-dp", "0"], "data_parallel_size must be >= 1"),
        (["serve", "--api-server-count", "2"], "--api-server-count: 2 API server"),
    ],
)
def test_bad_data_parallel_flags_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    status, _, err = _run(capsys, *argv)
    assert status == 2 and needle in err, err
    assert err.strip().count("\n") <= 1, err  # argparse's usage line, then the one error


def test_external_load_balancing_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config", "--format", "json", "-dp", "2", "--data-parallel-rank", "1"]
    status, out, err = _run(capsys, *argv, "--data-parallel-address", "10.0.0.5")
    assert status == 0, err
    parallel = json.loads(out)["parallel_config"]
    assert parallel["data_parallel_external_lb"] is True
    assert parallel["data_parallel_master_ip"] == "10.0.0.5"
    assert (parallel["data_parallel_rank"], parallel["data_parallel_index"]) == (1, 1)
