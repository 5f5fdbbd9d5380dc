"""The one contract between the scheduler and the worker.

The scheduler hands the worker a `SchedulerOutput` each step and receives a
`ModelRunnerOutput` back; nothing else crosses between them.  Both are plain
dataclasses with no torch inside, so the scheduler stays torch-free.

The worker keeps per-request state (token ids, block table, sampling state)
across steps: a request is sent in full once (`NewRequestData`, also again
after a preemption) and afterwards only as a delta (`CachedRequestData`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.kv_transfer.base import KVConnectorMetadata, KVConnectorOutput
    from minivllm.sampling_params import SamplingParams
    from minivllm.stats import RequestSpecDecodeStats


@dataclass
class NewRequestData:
    """A request the worker has not seen yet (or must rebuild after preemption)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    """Every KV block of the request so far, in order."""
    num_computed_tokens: int
    """Tokens whose KV is already in the cache (prefix-cache hits count here)."""
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens generated before a preemption; they are recomputed as part of the prompt."""
    grammar: Any = None
    """The request's compiled grammar (structured outputs), or None; the worker starts a
    matcher from it and replays output_token_ids through it."""
    lora_request: Any = None
    """The request's LoRA adapter (a `LoRARequest`), or None for the base model."""
    pooling_params: Any = None
    """A pooling request's `PoolingParams` (vLLM's field), or None."""


@dataclass
class CachedRequestData:
    """Deltas for requests the worker already holds, in scheduling order."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    """Blocks appended to each request's block table this step."""
    num_computed_tokens: list[int] = field(default_factory=list)
    """Tokens already computed for each request before this step."""
    num_kept_blocks: list[int | None] = field(default_factory=list)
    """Per request (may be empty: keep all): how many leading blocks of its table the
    worker keeps before appending ``new_block_ids``; the scheduler freed the others,
    which held only rejected draft tokens.  None keeps the whole table."""
    new_token_ids: list[list[int]] = field(default_factory=list)
    """Per request (may be empty: none sent): the tokens the engine sampled for it since
    it was last scheduled.  Only the output rank samples; with more than one rank the
    others learn the tokens from here (filled when the scheduler's
    ``send_sampled_tokens`` is on), so no collective per step is needed for them."""


@dataclass
class SchedulerOutput:
    """What the worker runs in one engine step."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    """Tokens to compute this step, per request id."""
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)
    """Requests that finished or were aborted/preempted since the last step: drop their state."""
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    """Draft tokens to verify this step, per request id; they are the last
    ``len(drafts)`` of its ``num_scheduled_tokens`` (speculative decoding only)."""
    num_spec_tokens_to_propose: int = 0
    """Draft tokens the worker proposes for each request that samples this step
    (0: none, e.g. speculation is off or disabled by the batch size)."""
    kv_connector_metadata: KVConnectorMetadata | None = None
    """What the KV connector's worker half loads and saves this step (None: no
    connector)."""
    removed_lora_ids: list[int] = field(default_factory=list)
    """LoRA adapters the engine removed since the last step: every rank drops their
    loaded weights (filled by the engine, not the scheduler)."""

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """What the worker returns for one `SchedulerOutput`."""

    req_ids: list[str]
    """The requests of the step, in the order the worker ran them."""
    sampled_token_ids: list[list[int]]
    """New tokens per request; empty for a request still in a partial (chunked) prefill.
    With speculative decoding: the accepted draft tokens, then one token the target
    sampled itself (a correction or a bonus)."""
    logprobs: list[Any | None] = field(default_factory=list)
    """Per request (parallel to req_ids): None, or a list with one entry per new token,
    each ``(token_id, logprob, rank, {top_token_id: logprob})``."""
    prompt_logprobs: dict[str, list[Any]] = field(default_factory=dict)
    """Per request id, prompt logprob entries computed this step (same entry form, or
    None for the first prompt token)."""
    spec_token_ids: list[list[int]] = field(default_factory=list)
    """Per request (parallel to req_ids, or empty): draft tokens proposed for the next
    step."""
    failed_req_ids: dict[str, str] = field(default_factory=dict)
    pooler_output: dict[str, Any] = field(default_factory=dict)
    """Pooling models: the pooled output (a float32 tensor, opaque here) of each request
    whose prompt finished this step; the scheduler finishes those requests."""
    """Requests the worker could not run because their own inputs failed (e.g. building
    their sampling generator raised), each with the error; they are not in req_ids, and
    the rest of the batch ran as usual."""
    kv_connector_output: KVConnectorOutput | None = None
    """The KV connector's report: loads that ended, the step's transfer counts."""


@dataclass
class EngineCoreOutput:
    """What the scheduler reports for one request after a step (for the output processor)."""

    request_id: str
    new_token_ids: list[int]
    """Tokens generated this step (empty for an unfinished chunked prefill)."""
    finish_reason: str | None = None
    """The finish reason once finished ("stop", "length", "abort" or "error"); None while
    running."""
    stop_reason: int | str | None = None
    """The stop token id that ended the request (None for EOS and length caps)."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first admission."""
    new_logprobs: list[Any] | None = None
    """Entries from `ModelRunnerOutput.logprobs`, one per token of new_token_ids."""
    new_prompt_logprobs: list[Any] | None = None
    """Prompt logprob entries computed this step, if requested."""
    num_preemptions: int = 0
    spec_decode: RequestSpecDecodeStats | None = None
    """The request's speculative decoding record so far (None when it had no drafts)."""
    error: str | None = None
    pooling_output: Any = None
    """A pooling request's pooled output (set when its prompt finished)."""
    """Why the request failed (finish_reason "error"); None otherwise."""
    kv_transfer_params: dict[str, Any] | None = None
    """The KV connector's parameters for the response (e.g. where a decode instance
    fetches this prefill's KV)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
