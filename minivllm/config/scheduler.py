"""`SchedulerConfig`: the per-step token budget, batch width and scheduling policy.

Defaults (documented choice). vLLM's dataclass defaults are 2048 tokens and
128 sequences, and its engine arguments raise them per platform and usage.
minivllm resolves unset sizes here, from the current platform, to vLLM's
serving defaults:

- CUDA: ``max_num_seqs=256``, ``max_num_batched_tokens=8192``;
- CPU: ``max_num_seqs=128``, ``max_num_batched_tokens=2048``.

Only values the user left unset are adapted, as vLLM's engine arguments do, so
that a default never conflicts with a value the user chose:

- an unset ``max_num_batched_tokens`` is raised to ``max_model_len`` when chunked
  prefill is off (a prompt must fit in one step), then capped at
  ``max_num_seqs * max_model_len`` (more could never be used); it is also raised
  to a user-set ``max_num_seqs`` (a minivllm addition: every sequence needs a token);
- an unset ``max_num_seqs`` is capped at ``max_num_batched_tokens``.

Two values the user set both are checked as given (see `verify_max_model_len`).
"""

from __future__ import annotations

from typing import Any, Literal

from minivllm.config.utils import config, hash_factors
from minivllm.logger import init_logger

logger = init_logger(__name__)

SchedulerPolicy = Literal["fcfs", "priority"]

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
"""vLLM's dataclass default token budget (used on CPU)."""
DEFAULT_MAX_NUM_SEQS = 128
"""vLLM's dataclass default batch width (used on CPU)."""
CUDA_MAX_NUM_BATCHED_TOKENS = 8192
"""Token budget on CUDA when unset (vLLM's serving default)."""
CUDA_MAX_NUM_SEQS = 256
"""Batch width on CUDA when unset (vLLM's serving default)."""
DEFAULT_MAX_MODEL_LEN = 8192
"""``max_model_len`` that `SchedulerConfig.default_factory` assumes before a model is known."""


@config
class SchedulerConfig:
    """Scheduler configuration."""

    max_num_batched_tokens: int | None = None
    """Most tokens processed in one engine step (the token budget). None: the
    platform default (8192 on CUDA, 2048 on CPU; see the module docstring)."""
    max_num_seqs: int | None = None
    """Most sequences in one step. None: 256 on CUDA, 128 on CPU."""
    max_num_scheduled_tokens: int | None = None
    """Most tokens the scheduler hands out per step. Equal to
    ``max_num_batched_tokens`` unless speculative decoding reserves slots;
    None means "same as max_num_batched_tokens" (see `scheduled_token_budget`)."""
    max_model_len: int | None = None
    """Longest sequence, copied from `ModelConfig.max_model_len`. Used only to
    validate the token budget; None skips those checks."""
    max_num_partial_prefills: int = 1
    """How many prompts may be partially prefilled at once (chunked prefill)."""
    max_long_partial_prefills: int = 1
    """How many of those may be longer than ``long_prefill_token_threshold``."""
    long_prefill_token_threshold: int = 0
    """A prompt longer than this counts as long; 0 means 4% of max_model_len
    when several partial prefills are allowed. Also caps one step's chunk of a
    prompt when positive."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps so decodes keep running."""
    is_encoder_decoder: bool = False
    """Whether the model is encoder-decoder (disables chunked prefill). Always
    False for minivllm's models."""
    is_multimodal_model: bool = False
    """Whether the model takes multimodal inputs. Always False here."""
    policy: SchedulerPolicy = "fcfs"
    """"fcfs": first come, first served. "priority": lower ``priority`` value
    first, ties broken by arrival time."""
    disable_chunked_mm_input: bool = False
    """Never split one multimodal item over steps (no effect: text models only)."""
    scheduler_cls: str | None = None
    """Qualified name of a custom scheduler class. Unsupported: must be None."""
    disable_hybrid_kv_cache_manager: bool | None = None
    """Use one KV layout for all layers even when the model mixes attention
    types: sliding-window layers then keep (and attend within) a whole-context
    block table instead of freeing what left their window. None lets `VllmConfig`
    decide."""
    async_scheduling: bool | None = None
    """Schedule step N+1 while step N runs. None lets `VllmConfig` decide."""
    stream_interval: int = 1
    """Stream output every this many tokens."""
    scheduler_reserve_full_isl: bool = True
    """Admit a request only when blocks for its whole prompt are free."""

    @staticmethod
    def default_factory(**kwargs: Any) -> SchedulerConfig:
        """A `SchedulerConfig` for `VllmConfig`'s default, before a model is known.

        ``max_model_len`` defaults to 8192 here, as in vLLM.
        """
        kwargs.setdefault("max_model_len", DEFAULT_MAX_MODEL_LEN)
        kwargs.setdefault("is_encoder_decoder", False)
        return SchedulerConfig(**kwargs)

    def __post_init__(self) -> None:
        if self.is_encoder_decoder:
            self.disable_chunked_mm_input = True
            self.enable_chunked_prefill = False
            self.long_prefill_token_threshold = 0
        self._resolve_batch_defaults()
        self.check_supported()
        for name in ("max_num_batched_tokens", "max_num_seqs", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_scheduled_tokens is not None and self.max_num_scheduled_tokens < 1:
            raise ValueError(
                f"max_num_scheduled_tokens must be >= 1, got {self.max_num_scheduled_tokens}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.max_num_partial_prefills > 1 and self.long_prefill_token_threshold == 0:
            if self.max_model_len:
                self.long_prefill_token_threshold = int(self.max_model_len * 0.04)
        self.verify_max_model_len(self.max_model_len)

    def _resolve_batch_defaults(self) -> None:
        """Fill the unset token budget and batch width (see the module docstring)."""
        from minivllm.platforms import current_platform

        on_cuda = current_platform.is_cuda()
        default_seqs = CUDA_MAX_NUM_SEQS if on_cuda else DEFAULT_MAX_NUM_SEQS
        user_seqs = self.max_num_seqs
        if self.max_num_batched_tokens is None:
            budget = CUDA_MAX_NUM_BATCHED_TOKENS if on_cuda else DEFAULT_MAX_NUM_BATCHED_TOKENS
            max_len = self.max_model_len
            if max_len and not self.enable_chunked_prefill:
                budget = max(budget, max_len)
            if user_seqs is not None:
                budget = max(budget, user_seqs)
            if max_len and max_len > 0:
                budget = min(budget, (user_seqs or default_seqs) * max_len)
            self.max_num_batched_tokens = budget
        if user_seqs is None:
            self.max_num_seqs = min(default_seqs, self.max_num_batched_tokens)

    @property
    def scheduled_token_budget(self) -> int:
        """Tokens the scheduler may hand out per step."""
        assert self.max_num_batched_tokens is not None
        return self.max_num_scheduled_tokens or self.max_num_batched_tokens

    def verify_max_model_len(self, max_model_len: int | None) -> None:
        """Check the token budget against the batch width and ``max_model_len``."""
        assert self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than "
                f"or equal to max_num_seqs ({self.max_num_seqs}): every running sequence needs "
                "at least one token per step. Increase max_num_batched_tokens or decrease "
                "max_num_seqs."
            )
        if max_model_len is None:
            return
        if self.max_num_batched_tokens < max_model_len and not self.enable_chunked_prefill:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}) with chunked prefill disabled, so longer "
                "prompts could never be scheduled. Increase max_num_batched_tokens to at least "
                f"{max_model_len}, decrease max_model_len, or enable chunked prefill."
            )
        if self.max_num_batched_tokens > self.max_num_seqs * max_model_len:
            logger.warning(
                "max_num_batched_tokens (%d) exceeds max_num_seqs * max_model_len (%d); "
                "the extra budget can never be used.",
                self.max_num_batched_tokens,
                self.max_num_seqs * max_model_len,
            )
        if self.max_num_partial_prefills > 1:
            if not self.enable_chunked_prefill:
                raise ValueError(
                    "max_num_partial_prefills > 1 needs chunked prefill; enable it or set "
                    "max_num_partial_prefills=1"
                )
            if self.long_prefill_token_threshold > max_model_len:
                raise ValueError(
                    f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) "
                    f"cannot exceed max_model_len ({max_model_len})"
                )
        if not 1 <= self.max_long_partial_prefills <= self.max_num_partial_prefills:
            raise ValueError(
                f"max_long_partial_prefills ({self.max_long_partial_prefills}) must be >= 1 "
                f"and <= max_num_partial_prefills ({self.max_num_partial_prefills})"
            )

    def check_supported(self) -> None:
        """Custom scheduler classes are the only unsupported setting."""
        if self.scheduler_cls is not None:
            raise ValueError(
                f"scheduler_cls={self.scheduler_cls!r}: custom scheduler classes are not "
                "supported by minivllm; leave it unset"
            )

    def compute_hash(self) -> str:
        """Scheduling does not change the compiled graph: no factors."""
        return hash_factors([])
