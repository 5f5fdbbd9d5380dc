"""`SchedulerOptions`: the scheduler's limits and policies, checked once.

`Scheduler` takes one of these instead of a long list of keywords; `from_config`
reads it from a resolved `VllmConfig` (through the Protocols of `config_view`, so
the scheduler stays torch-free).
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.scheduler.config_view import SchedulingConfig
from minivllm.scheduler.request_queue import SCHEDULING_POLICIES


@dataclass
class SchedulerOptions:
    """What one `Scheduler` may hand out per step and how it orders requests."""

    max_num_seqs: int
    """Most requests in one step (and running at once)."""
    max_num_batched_tokens: int
    """Token budget of one step (speculative decoding may reserve part of the config's
    budget: `from_config` passes ``max_num_scheduled_tokens`` when it is set)."""
    max_model_len: int
    """Longest context (prompt plus outputs) of one request."""
    enable_chunked_prefill: bool = True
    """Whether a prompt may be split across steps."""
    policy: str = "fcfs"
    """Order of the waiting queue and choice of preemption victim: "fcfs" or "priority"."""
    long_prefill_token_threshold: int = 0
    """Largest prefill chunk of one request per step (0: no cap; forced to 0 without
    chunked prefill, where a prompt runs whole)."""
    max_num_partial_prefills: int = 1
    """Most unfinished (chunked) prefills side by side."""
    max_long_partial_prefills: int = 1
    """Most unfinished prefills of prompts above ``long_prefill_token_threshold``."""
    reserve_full_isl: bool = True
    """Admit a request only if blocks for its whole remaining prompt are free now, so a
    chunked prefill is unlikely to stall (and force preemptions) halfway through."""
    num_lookahead_tokens: int = 0
    """KV slots to reserve past the scheduled tokens (a draft model's own drafts)."""
    num_speculative_tokens: int = 0
    """Drafts to verify per decoding request (0: no speculative decoding)."""
    spec_disable_batch_size: int | None = None
    """Speculation pauses while this many requests or more are active (None: never)."""
    max_concurrent_batches: int = 1
    """Batches the engine keeps in flight (the pipeline's stages); each batch takes at
    most its share of the active requests when this is above 1."""
    max_loras: int | None = None
    """Most distinct LoRA adapters among the running requests (None: LoRA off);
    a request for another adapter waits until one of them has no request left."""
    send_sampled_tokens: bool = False
    """Fill `CachedRequestData.new_token_ids` (more than one rank: the ranks that do
    not sample learn the tokens from there)."""

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "max_num_partial_prefills",
            "max_long_partial_prefills",
            "max_concurrent_batches",
        ):
            value = getattr(self, name)
            if value is None or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be >= 0 (0 disables it), "
                f"got {self.long_prefill_token_threshold}."
            )
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"Unknown scheduling policy {self.policy!r}; choose one of "
                f"{', '.join(SCHEDULING_POLICIES)}."
            )
        if not self.enable_chunked_prefill:
            # Capping prefill chunks only makes sense when prompts may be split.
            self.long_prefill_token_threshold = 0

    @classmethod
    def from_config(
        cls, vllm_config: SchedulingConfig, *, send_sampled_tokens: bool = False
    ) -> SchedulerOptions:
        """The options of a resolved `VllmConfig`; ``send_sampled_tokens`` as above (the
        engine knows whether its executor has more than one rank)."""
        sched = vllm_config.scheduler_config
        if vllm_config.model_config is None:
            raise ValueError("The VllmConfig has no model_config; the scheduler needs a model.")
        max_model_len = vllm_config.model_config.max_model_len
        # Filled by SchedulerConfig.__post_init__ and ModelConfig.__post_init__.
        assert sched.max_num_seqs is not None and sched.max_num_batched_tokens is not None
        assert max_model_len is not None
        # Configs without the speculative fields (older stand-ins) mean no speculation.
        spec = getattr(vllm_config, "speculative_config", None)
        lora = getattr(vllm_config, "lora_config", None)
        return cls(
            max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_scheduled_tokens or sched.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=sched.enable_chunked_prefill,
            policy=sched.policy,
            long_prefill_token_threshold=sched.long_prefill_token_threshold,
            max_num_partial_prefills=sched.max_num_partial_prefills,
            max_long_partial_prefills=sched.max_long_partial_prefills,
            reserve_full_isl=sched.scheduler_reserve_full_isl,
            num_lookahead_tokens=vllm_config.num_lookahead_tokens if spec else 0,
            num_speculative_tokens=vllm_config.num_speculative_tokens if spec else 0,
            spec_disable_batch_size=spec.disable_by_batch_size if spec else None,
            # One batch per pipeline stage: the engine never overlaps a step with the
            # next, so async scheduling's extra batch (in vLLM's bound) is not run here.
            max_concurrent_batches=vllm_config.parallel_config.pipeline_parallel_size,
            max_loras=lora.max_loras if lora is not None else None,
            send_sampled_tokens=send_sampled_tokens,
        )
