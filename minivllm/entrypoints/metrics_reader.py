"""Engine metrics as objects, read from a Prometheus registry, as vLLM's
``vllm.v1.metrics.reader`` gives them to ``LLM.get_metrics()``.

Counters become `Counter`, gauges `Gauge`, histograms `Histogram` (cumulative bucket
counts keyed by upper bound), and the per-position speculative decoding counter one
`Vector` whose values are indexed by draft position.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

PER_POS_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class Metric:
    """A metric's name (vLLM's, without Prometheus' ``_total``) and its labels."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Vector(Metric):
    """A counter per index (the draft position), as a list."""

    values: list[int]


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]
    """Upper bound ("le") -> observations at or below it (cumulative)."""


def get_metrics_snapshot(registry: CollectorRegistry) -> list[Metric]:
    """Every ``vllm:`` metric of ``registry`` now."""
    out: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith("vllm:"):
            continue
        if family.type == "gauge":
            out += [Gauge(family.name, dict(s.labels), s.value) for s in family.samples]
        elif family.type == "counter":
            samples = [s for s in family.samples if s.name.endswith("_total")]
            if family.name == PER_POS_METRIC:
                out += _vectors(family.name, samples)
            else:
                out += [Counter(family.name, dict(s.labels), int(s.value)) for s in samples]
        elif family.type == "histogram":
            out += _histograms(family.name, family.samples)
    return out


def _vectors(name: str, samples: list) -> list[Metric]:
    groups: dict[tuple, dict[int, int]] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != "position"}
        groups.setdefault(tuple(sorted(labels.items())), {})[int(s.labels["position"])] = int(
            s.value
        )
    return [
        Vector(name, dict(key), [by_pos[i] for i in sorted(by_pos)])
        for key, by_pos in groups.items()
    ]


def _histograms(name: str, samples: list) -> list[Metric]:
    groups: dict[tuple, Histogram] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        key = tuple(sorted(labels.items()))
        hist = groups.setdefault(key, Histogram(name, labels, 0, 0.0, {}))
        if s.name.endswith("_bucket"):
            hist.buckets[s.labels["le"]] = int(s.value)
        elif s.name.endswith("_count"):
            hist.count = int(s.value)
        elif s.name.endswith("_sum"):
            hist.sum = float(s.value)
    return list(groups.values())
