"""A request as the scheduler tracks it: tokens, progress, status."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from minivllm.kv_cache.hashing import BlockHash
from minivllm.stats import RequestSpecDecodeStats

if TYPE_CHECKING:
    from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Life cycle of a request; every status after PREEMPTED is final."""

    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    """Its KV blocks are allocated and a KV connector is loading them."""
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    """EOS, a stop token id, or a stop string (the detokenizer finishes those)."""
    FINISHED_LENGTH_CAPPED = enum.auto()
    """max_tokens generated or max_model_len reached."""
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()
    """The worker could not run this request's own inputs (e.g. its sampling set-up
    failed); the rest of the batch went on."""

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        """The OpenAI-style finish reason, or None while unfinished."""
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One sequence to generate: prompt, generated tokens, and scheduling progress.

    ``num_computed_tokens`` counts tokens whose KV is in the cache, including
    the tokens scheduled in the step now running (the scheduler advances it when
    it schedules them).  ``num_tokens - num_computed_tokens`` is therefore the
    work left: the rest of the prompt while prefilling, 1 while decoding.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        lora_request: Any = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"Request {request_id!r} has an empty prompt; give at least 1 token.")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        """Lower runs first under the priority policy (as in vLLM)."""
        self.grammar: object | None = None
        """The compiled grammar of a structured-output request (opaque here: the engine
        sets it, the worker builds a matcher from it, also after a preemption)."""
        self.pooling_params: object | None = None
        """A pooling request's `PoolingParams` (opaque here: the worker reads a pair's
        token types from it)."""
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        """The stop token id (or stop string) that finished the request, if any."""
        self.output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None
        """Prompt tokens served from the prefix cache at first admission (None before it)."""
        self.num_preemptions = 0
        self.max_tokens: int | None = sampling_params.max_tokens
        """Output cap; the scheduler fills it from max_model_len when the params leave None."""
        self.spec_token_ids: list[int] = []
        """Draft tokens proposed for the next step (speculative decoding); never part of
        the token ids or the block hashes until the target accepts them."""
        self.spec_decode: RequestSpecDecodeStats | None = None
        self.num_in_flight_batches = 0
        """Scheduled batches whose results have not come back yet (pipeline parallelism
        keeps several in flight; always 0 between steps otherwise)."""
        self.num_output_tokens_sent = 0
        """Output tokens the workers already hold (sent with the request, or in
        `CachedRequestData.new_token_ids`)."""
        self.lora_request = lora_request
        """The request's LoRA adapter (a `LoRARequest`; opaque here), or None."""
        extra = sampling_params.extra_args or {}
        self.kv_transfer_params: dict[str, Any] | None = extra.get("kv_transfer_params")
        """What the KV connector reads (vLLM's ``kv_transfer_params``, e.g. from a proxy)."""
        self.kv_transfer_params_out: dict[str, Any] | None = None
        """What the KV connector returns with the finished request's response."""
        self.block_hashes: list[BlockHash] = []
        self.block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def lora_int_id(self) -> int:
        """The adapter's id (0: the base model)."""
        return 0 if self.lora_request is None else int(self.lora_request.lora_int_id)

    @property
    def cache_extra_keys(self) -> tuple[Any, ...] | None:
        """What the prefix-cache hashes mix in beyond the tokens: the adapter, so the
        same prompt under two adapters (or none) never shares KV blocks."""
        lora = self.lora_request
        return None if lora is None else (lora.lora_name, lora.lora_int_id)

    # -- token views ------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens (do not mutate)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        for token_id in token_ids:
            self.output_token_ids.append(token_id)
            self._all_token_ids.append(token_id)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash the blocks completed since the last call (no-op without a hasher)."""
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

    # -- status ---------------------------------------------------------------
    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        """ "stop", "length", "abort", "error", or None while the request is unfinished."""
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_prompt_tokens}+{self.num_output_tokens}, "
            f"computed={self.num_computed_tokens})"
        )


def check_stop(request: Request, max_model_len: int) -> bool:
    """Apply the stop rules to the request's newest token; sets its status if it finished.

    EOS and stop token ids count only once ``min_tokens`` are out; a stop token wins
    over a length cap reached by the same token (the finish reason is then "stop").
    Stop strings are not handled here: the detokenizer finishes those requests.
    """
    params = request.sampling_params
    last = request.output_token_ids[-1]
    if request.num_output_tokens >= params.min_tokens:
        # The field is typed Optional, but __post_init__ turns None into [].
        stop_ids = params.stop_token_ids or ()
        if not params.ignore_eos and _is_eos(request, last, stop_ids):
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in stop_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
    max_tokens = request.max_tokens
    if request.num_tokens >= max_model_len or (
        max_tokens is not None and request.num_output_tokens >= max_tokens
    ):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def _is_eos(request: Request, token_id: int, stop_ids: Collection[int]) -> bool:
    if token_id == request.eos_token_id:
        return True
    # The engine puts the model's other EOS ids into all_stop_token_ids, next to the
    # user's stop_token_ids (which report a stop_reason instead).
    return token_id in request.sampling_params.all_stop_token_ids and token_id not in stop_ids
