"""Engine statistics that the scheduler fills and the engine and server read.

Torch-free and free of imports from the rest of minivllm, so the scheduler (which
produces them), the engine loop and the Prometheus endpoint (which consume them) all
import it without depending on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Speculative decoding counts (cumulative over the engine's life, as vLLM's
    counters are): a draft is one request's proposal verified in one step."""

    num_spec_tokens: int
    """Draft tokens proposed per step (the configured num_speculative_tokens)."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    """Accepted drafts by position in the draft (0: the first draft token)."""

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step: 1 (the target's own) + accepted drafts."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def copy(self) -> SpecDecodingStats:
        return SpecDecodingStats(
            self.num_spec_tokens,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_tokens_per_pos),
        )


@dataclass
class RequestSpecDecodeStats:
    """One request's speculative decoding record (per_request_spec_decode_metrics)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_step: list[tuple[int, int]] = field(default_factory=list)
    """(accepted, proposed) for each verification step, in order."""

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        self.accepted_per_step.append((num_accepted_tokens, num_draft_tokens))

    def summary(self, detailed: bool = False) -> dict[str, object]:
        """The per-request metrics as a JSON-able dict ("summary" or "detailed")."""
        hist: dict[int, int] = {}
        for accepted, _ in self.accepted_per_step:
            hist[accepted] = hist.get(accepted, 0) + 1
        out: dict[str, object] = {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": (
                1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
            ),
            "acceptance_rate": (
                self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
            ),
            "accepted_histogram": {str(k): v for k, v in sorted(hist.items())},
        }
        if detailed:
            out["per_step"] = [list(step) for step in self.accepted_per_step]
        return out


@dataclass
class PromptTokenStats:
    """Where each admitted request's prompt tokens came from (cumulative, in tokens;
    counted once per request, at its first admission): vLLM's
    ``vllm:prompt_tokens_by_source``."""

    local_compute: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0


@dataclass
class KVConnectorStats:
    """Cumulative counts of a KV connector (transfers between the KV pool and the
    outside: a storage directory, the offload tier, another engine)."""

    num_loaded_blocks: int = 0
    num_loaded_bytes: int = 0
    load_time_s: float = 0.0
    """Seconds spent reading and copying blocks in."""
    num_saved_blocks: int = 0
    num_saved_bytes: int = 0
    save_time_s: float = 0.0
    num_failed_loads: int = 0
    """Requests whose load failed (the producer was unreachable, a file was corrupt)."""
    num_corrupt_blocks: int = 0
    """Stored blocks whose checksum or layout did not match (treated as misses)."""
    external_queries: int = 0
    """Prompt tokens looked up in the connector (vLLM's external prefix cache)."""
    external_hits: int = 0
    """Of those, tokens the connector held."""

    def add(self, other: KVConnectorStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def copy(self) -> KVConnectorStats:
        return KVConnectorStats(**{n: getattr(self, n) for n in self.__dataclass_fields__})


@dataclass
class SchedulerStats:
    """A snapshot for metrics; the prefix-cache and preemption counts are cumulative."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    """Fraction of KV blocks held by requests."""
    prefix_cache_requests: int
    prefix_cache_queries: int
    """Tokens looked up in the prefix cache."""
    prefix_cache_hits: int
    """Tokens found in the prefix cache."""
    num_preemptions: int
    spec_decoding_stats: SpecDecodingStats | None = None
    """Cumulative speculative decoding counts; None when speculation is off."""
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    """LoRA adapter name -> running requests that use it."""
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    """LoRA adapter name -> waiting requests that use it."""
    prompt_token_stats: PromptTokenStats | None = None
    """Cumulative prompt tokens by source."""
    kv_connector_stats: KVConnectorStats | None = None
    """Cumulative KV connector counts; None without a connector."""


@dataclass
class FinishedRequestStats:
    """What the metrics need to know about one finished request (all its completions)."""

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    queue_time: float = 0.0
    """Arrival to the start of the first step that computed any of its tokens."""
    prefill_time: float = 0.0
    """That step's start to the first token."""
    decode_time: float = 0.0
    """First token to last token."""
    inference_time: float = 0.0
    """First scheduled step's start to the last token (prefill + decode)."""
    n: int = 1
    max_tokens: int | None = None


@dataclass
class IterationStats:
    """Token counts and latencies produced by one engine step (or one batch of aborts)."""

    num_prompt_tokens: int = 0
    """Prompt tokens of requests that produced their first token in this step."""
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


__all__ = [
    "FinishedRequestStats",
    "IterationStats",
    "KVConnectorStats",
    "PromptTokenStats",
    "RequestSpecDecodeStats",
    "SchedulerStats",
    "SpecDecodingStats",
]
