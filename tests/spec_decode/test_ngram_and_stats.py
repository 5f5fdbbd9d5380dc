"""Prompt lookup, and the speculative decoding statistics in the periodic log and in
Prometheus (unit level; the engine-level figures are in test_spec_decode_e2e.py)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from minivllm.engine.stat_logger import LoggingStatLogger
from minivllm.entrypoints.metrics_reader import Counter, Vector, get_metrics_snapshot
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.stats import IterationStats, SchedulerStats, SpecDecodingStats
from minivllm.worker.ngram_proposer import NgramProposer


def test_ngram_prefers_the_longest_match_then_the_latest() -> None:
    proposer = NgramProposer(1, 3)
    # "1 2 3" occurs twice before the suffix; the later one continues with 7 8.
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 6, 1, 2, 3]
    assert proposer.propose(tokens, 2) == [7, 8]
    # The longest n wins over a later, shorter match ("3" alone is followed by 9).
    assert NgramProposer(1, 2).propose([5, 3, 1, 4, 2, 3, 9, 9, 5, 3], 1) == [1]
    # Fewer than k tokens after the only match: what there is.
    assert proposer.propose([4, 5, 6, 4, 5], 3) == [6, 4, 5]
    # No match of at least prompt_lookup_min tokens: no drafts.
    assert NgramProposer(2, 3).propose([1, 2, 3, 4, 1], 3) == []
    assert proposer.propose([7], 3) == []


def test_ngram_on_a_repeating_loop_proposes_full_drafts() -> None:
    # The latest match would leave one token; a match with k tokens after it is used.
    assert NgramProposer(1, 1).propose([6, 6, 6, 6, 6], 3) == [6, 6, 6]


def sched_stats(spec: SpecDecodingStats | None) -> SchedulerStats:
    return SchedulerStats(1, 0, 0.5, 0, 0, 0, 0, spec_decoding_stats=spec)


def test_periodic_log_reports_the_acceptance_rate(caplog: pytest.LogCaptureFixture) -> None:
    logger = LoggingStatLogger(interval_s=3600)
    spec = SpecDecodingStats(3)
    spec.observe_draft(3, 3)
    spec.observe_draft(3, 1)
    logger.record(sched_stats(spec), IterationStats(num_generation_tokens=8))
    with caplog.at_level(logging.INFO, logger="minivllm"):
        logger.log(sched_stats(spec))
    line = logger.last_lines[1]
    assert "Mean acceptance length: 3.00" in line
    assert "Accepted: 4 tokens, Drafted: 6 tokens" in line
    assert "Per-position acceptance rate: 1.000, 0.500, 0.500" in line
    assert "Avg Draft acceptance rate: 66.7%" in line
    assert "Avg Draft acceptance rate" in caplog.text
    # The next line covers only what happened since.
    spec.observe_draft(3, 0)
    logger.log(sched_stats(spec))
    assert "Accepted: 0 tokens, Drafted: 3 tokens" in logger.last_lines[1]
    logger.log(sched_stats(None))
    assert len(logger.last_lines) == 1  # no speculation: no second line


def test_prometheus_counters_use_vllm_names() -> None:
    registry = CollectorRegistry()
    prom = PrometheusStatLogger("m", 128, registry, num_spec_tokens=2)
    spec = SpecDecodingStats(2)
    spec.observe_draft(2, 1)
    prom.record(sched_stats(spec), IterationStats())
    spec.observe_draft(2, 2)
    prom.record(sched_stats(spec), IterationStats())
    text = prom.render().decode()
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 2.0' in text
    assert "vllm:spec_decode_num_draft_tokens_total" in text
    assert 'position="1"' in text
    metrics = {m.name: m for m in get_metrics_snapshot(registry)}
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"]
    assert isinstance(accepted, Counter) and accepted.value == 3
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert isinstance(per_pos, Vector) and per_pos.values == [2, 1]
    # Without speculation the counters are not registered at all (as in vLLM).
    plain = CollectorRegistry()
    PrometheusStatLogger("m", 128, plain)
    assert not [m for m in get_metrics_snapshot(plain) if "spec_decode" in m.name]
