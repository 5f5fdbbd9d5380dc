"""Continuous batching: which tokens of which requests run in each engine step.

Each step fills a token budget (``max_num_batched_tokens``) and a sequence cap
(``max_num_seqs``).  Running requests go first (decodes and the rest of chunked
prefills), then waiting ones in policy order (fcfs, or priority), so prefills
and decodes share a step.  A request's work is simply ``num_tokens -
num_computed_tokens``, which makes prefill, decode, chunked prefill and
recomputation after preemption one code path.  When the KV cache runs out of
blocks for a running request, the newest running request (the least urgent one
under the priority policy) is preempted: its blocks are freed and it returns to
the waiting queue, to be recomputed from its prompt plus the tokens it already
generated.

With pipeline parallelism the engine keeps up to ``max_concurrent_batches``
batches in flight.  Scheduling already counts a batch's tokens as computed, so a
decoding request in flight has no work left until its token comes back and is
never in two batches; its prompt chunks may be (the stages run batches in order).
To give every stage work, each batch takes at most its share of the active
requests (``ceil(active / max_concurrent_batches)``), and the results of a
request preempted or finished while in flight are dropped when they arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from minivllm.kv_cache.manager import KVCacheManager
from minivllm.logger import init_logger
from minivllm.math_utils import cdiv
from minivllm.scheduler.config_view import SchedulingConfig
from minivllm.scheduler.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from minivllm.scheduler.request import Request, RequestStatus, check_stop
from minivllm.scheduler.request_queue import SCHEDULING_POLICIES, make_request_queue
from minivllm.scheduler.spec_decode import SpecDecodeState
from minivllm.stats import SchedulerStats

logger = init_logger(__name__)


class Scheduler:
    """Decides each step's batch and applies the model's results to the requests."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        policy: str = "fcfs",
        long_prefill_token_threshold: int = 0,
        num_lookahead_tokens: int = 0,
        max_num_partial_prefills: int = 1,
        max_long_partial_prefills: int = 1,
        reserve_full_isl: bool = True,
        num_speculative_tokens: int = 0,
        spec_disable_batch_size: int | None = None,
        max_concurrent_batches: int = 1,
        send_sampled_tokens: bool = False,
    ) -> None:
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
            ("max_num_partial_prefills", max_num_partial_prefills),
            ("max_long_partial_prefills", max_long_partial_prefills),
            ("max_concurrent_batches", max_concurrent_batches),
        ):
            if value is None or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be >= 0 (0 disables it), "
                f"got {long_prefill_token_threshold}."
            )
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"Unknown scheduling policy {policy!r}; choose one of "
                f"{', '.join(SCHEDULING_POLICIES)}."
            )
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy
        # Capping prefill chunks only makes sense when prompts may be split.
        self.long_prefill_token_threshold = (
            long_prefill_token_threshold if enable_chunked_prefill else 0
        )
        self.num_lookahead_tokens = num_lookahead_tokens
        self.max_num_partial_prefills = max_num_partial_prefills
        self.max_long_partial_prefills = max_long_partial_prefills
        # Admit a request only if blocks for its whole remaining prompt are free now, so a
        # chunked prefill is unlikely to stall (and force preemptions) halfway through.
        self.reserve_full_isl = reserve_full_isl
        self.max_concurrent_batches = max_concurrent_batches
        """Batches the engine keeps in flight (the pipeline's stages); each batch takes at
        most its share of the active requests when this is above 1."""
        self.send_sampled_tokens = send_sampled_tokens
        """Fill `CachedRequestData.new_token_ids` (more than one rank: the ranks that do
        not sample learn the tokens from there)."""
        # Batches scheduled but not yet updated: id of the SchedulerOutput -> (it, requests).
        self._in_flight: dict[int, tuple[SchedulerOutput, list[Request]]] = {}

        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(policy)
        self.running: list[Request] = []
        # Ids the worker must forget at the next step (finished, aborted, preempted).
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self._pending_outputs: list[EngineCoreOutput] = []
        # Speculative decoding: draft limits, rollback, acceptance counts (None: off).
        self.spec: SpecDecodeState | None = None
        if num_speculative_tokens:
            self.spec = SpecDecodeState(
                kv_cache_manager,
                num_speculative_tokens=num_speculative_tokens,
                num_lookahead_tokens=num_lookahead_tokens,
                disable_batch_size=spec_disable_batch_size,
                max_model_len=max_model_len,
            )

    @classmethod
    def from_config(
        cls,
        vllm_config: SchedulingConfig,
        num_blocks: int,
        kv_group_windows: Sequence[int | None] = (None,),
        *,
        max_concurrent_batches: int = 1,
        send_sampled_tokens: bool = False,
    ) -> Scheduler:
        """Build the scheduler and its KV cache manager from a resolved `VllmConfig`;
        ``kv_group_windows``: the sliding window of each KV cache group (the worker's
        `KVCacheGroups.windows`; one full-attention group by default); the last two
        as in `Scheduler` (the engine knows its executor's ranks)."""
        sched = vllm_config.scheduler_config
        cache = vllm_config.cache_config
        if vllm_config.model_config is None:
            raise ValueError("The VllmConfig has no model_config; the scheduler needs a model.")
        max_model_len = vllm_config.model_config.max_model_len
        if cache.block_size is None:
            raise ValueError("cache_config.block_size is unset; resolve the VllmConfig first.")
        # Filled by SchedulerConfig.__post_init__ and ModelConfig.__post_init__.
        assert sched.max_num_seqs is not None and sched.max_num_batched_tokens is not None
        assert max_model_len is not None
        manager = KVCacheManager(
            num_blocks=num_blocks,
            block_size=cache.block_size,
            enable_caching=cache.enable_prefix_caching,
            hash_algo=cache.prefix_caching_hash_algo,
            max_model_len=max_model_len,
            group_windows=kv_group_windows,
            max_num_batched_tokens=sched.max_num_batched_tokens,
        )
        # Speculative decoding may reserve part of the batch: the scheduler hands out
        # max_num_scheduled_tokens when the config sets it (None: the whole budget).
        budget = sched.max_num_scheduled_tokens or sched.max_num_batched_tokens
        # Configs without the speculative fields (older stand-ins) mean no speculation.
        spec = getattr(vllm_config, "speculative_config", None)
        return cls(
            manager,
            max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=budget,
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
            max_concurrent_batches=max_concurrent_batches,
            send_sampled_tokens=send_sampled_tokens,
        )

    # -- requests in and out ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError if it can never be scheduled as given."""
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"Request id {rid!r} is already in use; request ids must be unique.")
        self.check_request(request.num_prompt_tokens, request.priority)
        if request.max_tokens is None:
            request.max_tokens = self.max_model_len - request.num_prompt_tokens
        if request.block_hasher is None and self.kv_cache_manager.enable_caching:
            request.block_hasher = self.kv_cache_manager.block_hasher
            request.update_block_hashes()
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.waiting.add(request)

    def check_request(self, num_prompt_tokens: int, priority: int = 0) -> None:
        """ValueError for a request this scheduler could never run (pure: the API thread
        calls it too, so that such a request is refused before its stream starts)."""
        if num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"The prompt ({num_prompt_tokens} tokens) is longer than the maximum "
                f"model length ({self.max_model_len}); shorten it or raise max_model_len."
            )
        if not self.enable_chunked_prefill and num_prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"The prompt ({num_prompt_tokens} tokens) exceeds "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) and chunked prefill "
                "is disabled; enable chunked prefill or raise max_num_batched_tokens."
            )
        kv_capacity = self.kv_cache_manager.max_num_tokens
        if num_prompt_tokens > kv_capacity:
            raise ValueError(
                f"The prompt ({num_prompt_tokens} tokens) does not fit in the whole KV "
                f"cache ({kv_capacity} tokens); shorten it or give the KV cache more memory."
            )
        if priority != 0 and self.policy != "priority":
            raise ValueError(
                f"priority {priority} needs the 'priority' scheduling policy, but the policy "
                f"is {self.policy!r}; use policy 'priority' or leave priority at 0."
            )

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish requests from outside (abort, stop string); frees all their blocks at once.

        Unknown or already finished ids are ignored: a request may finish in the
        same step as the caller decides to abort it.
        """
        if not RequestStatus.is_finished(status):
            raise ValueError(f"{status.name} is not a finished status.")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.forget(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    # -- one step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens, allocating (and if needed preempting) KV blocks."""
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        preempted_any = False
        spec_tokens: dict[str, list[int]] = {}
        spec = self.spec
        use_spec = spec is not None and spec.speculating(len(self.running) + len(self.waiting))
        # Several batches in flight: each takes its share, so that every stage has work.
        max_reqs = self.max_num_seqs
        if self.max_concurrent_batches > 1:
            active = len(self.running) + len(self.waiting)
            max_reqs = max(1, cdiv(active, self.max_concurrent_batches))

        idx = 0
        while idx < len(self.running) and budget > 0 and len(num_scheduled) < max_reqs:
            request = self.running[idx]
            num_new = self._cap_chunk(request.num_tokens - request.num_computed_tokens, budget)
            drafts = spec.drafts_to_verify(request, budget) if spec and use_spec else []
            request.spec_token_ids = []
            if drafts and num_new == 1:
                spec_tokens[request.request_id] = drafts
                num_new += len(drafts)
            if num_new <= 0:
                idx += 1
                continue
            block_ids = self.kv_cache_manager.allocate_slots(
                request, num_new, num_lookahead_tokens=self.num_lookahead_tokens
            )
            if block_ids is None and request.request_id in spec_tokens:
                # Drafts are optional: without them the request may still fit.
                num_new -= len(spec_tokens.pop(request.request_id))
                block_ids = self.kv_cache_manager.allocate_slots(
                    request, num_new, num_lookahead_tokens=self.num_lookahead_tokens
                )
            while block_ids is None:
                victim = self._pick_victim()
                if victim is request and len(self.running) == 1:
                    # Alone and still short: its context outgrew the whole KV cache.
                    self._finish_out_of_kv_cache(request)
                    break
                victim_idx = self.running.index(victim)
                del self.running[victim_idx]
                if victim_idx < idx:
                    idx -= 1
                if victim.request_id in num_scheduled:
                    # Undo its place in this step before freeing its blocks.
                    scheduled_running.remove(victim)
                    budget += num_scheduled.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    spec_tokens.pop(victim.request_id, None)
                self._preempt(victim)
                preempted_any = True
                if victim is request:
                    break
                block_ids = self.kv_cache_manager.allocate_slots(
                    request, num_new, num_lookahead_tokens=self.num_lookahead_tokens
                )
            if block_ids is None:
                spec_tokens.pop(request.request_id, None)
                continue  # it left self.running; self.running[idx] is now the next request
            scheduled_running.append(request)
            num_scheduled[request.request_id] = num_new
            new_block_ids[request.request_id] = block_ids
            budget -= num_new
            idx += 1

        # Prefills that stay unfinished after this step, to cap how many run side by side.
        num_partial = num_long_partial = 0
        for request in scheduled_running:
            if request.num_computed_tokens + num_scheduled[request.request_id] < request.num_tokens:
                num_partial += 1
                num_long_partial += int(0 < self.long_prefill_token_threshold < request.num_tokens)

        # A preemption means the cache is full: admitting new work would only thrash.
        while (
            not preempted_any
            and len(self.waiting) > 0
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and len(num_scheduled) < max_reqs
        ):
            request = self.waiting.peek()
            if request.num_in_flight_batches:
                break  # preempted while a batch of it ran: resume once that batch is back
            hit_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit_tokens
            if 0 < self.long_prefill_token_threshold < num_new:
                num_new = self.long_prefill_token_threshold
            if num_new > budget:
                # Without chunking a prompt runs whole, so it waits for a roomier step;
                # only a recomputed context longer than any step (prompt + outputs after
                # a preemption) is split anyway, or it could never run again.
                if not self.enable_chunked_prefill and num_new <= self.max_num_batched_tokens:
                    break
                num_new = budget
            is_partial = num_hit_tokens + num_new < request.num_tokens
            is_long = is_partial and 0 < self.long_prefill_token_threshold < request.num_tokens
            if is_partial and (
                num_partial >= self.max_num_partial_prefills
                or (is_long and num_long_partial >= self.max_long_partial_prefills)
            ):
                break
            block_ids = None
            if not self.reserve_full_isl or self.kv_cache_manager.can_allocate(
                request, request.num_tokens - num_hit_tokens, hit_blocks
            ):
                block_ids = self.kv_cache_manager.allocate_slots(
                    request, num_new, hit_blocks, num_lookahead_tokens=self.num_lookahead_tokens
                )
            if block_ids is None:
                if self.running:
                    break  # blocks come back as running requests finish
                # Every block is free and it still does not fit: it never will.
                self.waiting.pop()
                self.running.append(request)
                self._finish_out_of_kv_cache(request)
                continue
            self.waiting.pop()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_hit_tokens
            scheduled_new.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            num_partial += int(is_partial)
            num_long_partial += int(is_long)

        output = SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(r) for r in scheduled_new],
            scheduled_cached_reqs=CachedRequestData(
                req_ids=[r.request_id for r in scheduled_running],
                new_block_ids=[new_block_ids[r.request_id] for r in scheduled_running],
                num_computed_tokens=[r.num_computed_tokens for r in scheduled_running],
                num_kept_blocks=[
                    spec.kept_blocks.pop(r.request_id, None) if spec else None
                    for r in scheduled_running
                ],
                new_token_ids=[self._unsent_tokens(r) for r in scheduled_running]
                if self.send_sampled_tokens
                else [],
            ),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            scheduled_spec_decode_tokens=spec_tokens,
            num_spec_tokens_to_propose=spec.num_speculative_tokens if spec and use_spec else 0,
        )
        self.finished_req_ids = set()
        # Scheduled tokens count as computed from now on, so the next schedule() (which may
        # run before this step's results arrive in a pipelined engine) does not repeat them.
        scheduled = [*scheduled_running, *scheduled_new]
        for request in scheduled:
            request.num_computed_tokens += num_scheduled[request.request_id]
            request.num_in_flight_batches += 1
        if scheduled:
            self._in_flight[id(output)] = (output, scheduled)
        return output

    def return_unsent(self, scheduler_output: SchedulerOutput) -> None:
        """The engine will not send this empty output: its finished ids go with the next."""
        assert scheduler_output.is_empty, "only an empty output may be held back"
        self.finished_req_ids |= scheduler_output.finished_req_ids

    @staticmethod
    def _unsent_tokens(request: Request) -> list[int]:
        tokens = request.output_token_ids[request.num_output_tokens_sent :]
        request.num_output_tokens_sent = request.num_output_tokens
        return tokens

    def _cap_chunk(self, num_new: int, budget: int) -> int:
        if 0 < self.long_prefill_token_threshold < num_new:
            num_new = self.long_prefill_token_threshold
        return min(num_new, budget)

    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.forget(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(request)
        # The worker drops its copy; the request comes back as a new one.
        self.finished_req_ids.add(request.request_id)
        logger.debug("Preempted %s (KV cache full).", request.request_id)

    def _finish_out_of_kv_cache(self, request: Request) -> None:
        logger.warning(
            "Request %s needs more KV blocks than the whole cache holds (%d tokens); it is "
            "finished with reason 'length'. Lower max_model_len or give the KV cache more memory.",
            request.request_id,
            self.kv_cache_manager.max_num_tokens,
        )
        self.running.remove(request)
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self._free_request(request)
        self._pending_outputs.append(self._make_output(request, [], None, None))

    def _new_request_data(self, request: Request) -> NewRequestData:
        request.num_output_tokens_sent = request.num_output_tokens
        return NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
            output_token_ids=list(request.output_token_ids),
            grammar=request.grammar,
        )

    # -- results ----------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop conditions, publish full blocks, free finished."""
        row = {rid: i for i, rid in enumerate(model_runner_output.req_ids)}
        sampled_rows = model_runner_output.sampled_token_ids
        draft_rows = model_runner_output.spec_token_ids
        logprob_rows = model_runner_output.logprobs
        # Requests the scheduler itself finished while scheduling this step come first.
        outputs, self._pending_outputs = self._pending_outputs, []
        # The request objects this batch ran (a later request may reuse a finished id).
        ran: dict[str, Request] | None = None
        batch = self._in_flight.pop(id(scheduler_output), None)
        if batch is not None:
            ran = {r.request_id: r for r in batch[1]}
            for r in batch[1]:
                r.num_in_flight_batches -= 1
        finished_ids: set[str] = set()
        for rid, error in model_runner_output.failed_req_ids.items():
            request = self.requests.get(rid)
            if request is None or request.is_finished:
                continue
            # Only this request's own inputs failed: finish it, free its blocks, go on.
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request)
            finished_ids.add(rid)
            output = self._make_output(request, [], None, None)
            output.error = error
            outputs.append(output)
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or (ran is not None and ran.get(rid) is not request):
                continue  # finished or aborted while the step ran
            if request.status != RequestStatus.RUNNING:
                continue  # preempted while the step ran: it recomputes from its tokens
            i = row.get(rid)
            sampled = sampled_rows[i] if i is not None else []
            new_token_ids: list[int] = []
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid)
            if drafts and sampled and self.spec is not None:
                self.spec.roll_back(request, len(drafts), len(sampled) - 1)
            # Tokens sampled in the middle of a chunked prefill are meaningless.
            if sampled and request.num_computed_tokens >= request.num_tokens:
                for token_id in sampled:
                    request.append_output_token_ids(token_id)
                    new_token_ids.append(token_id)
                    if check_stop(request, self.max_model_len):
                        break
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)

            logprob_row = logprob_rows[i] if i is not None and i < len(logprob_rows) else None
            new_logprobs = None if logprob_row is None else list(logprob_row)[: len(new_token_ids)]
            prompt_logprobs = model_runner_output.prompt_logprobs.get(rid)
            if request.is_finished:
                self._free_request(request)
                finished_ids.add(rid)
            elif i is not None and i < len(draft_rows) and new_token_ids:
                request.spec_token_ids = list(draft_rows[i])
            if new_token_ids or request.is_finished or prompt_logprobs:
                outputs.append(
                    self._make_output(request, new_token_ids, new_logprobs, prompt_logprobs)
                )
        if finished_ids:
            self.running = [r for r in self.running if r.request_id not in finished_ids]
        return outputs

    @staticmethod
    def _make_output(
        request: Request,
        new_token_ids: list[int],
        new_logprobs: list[Any] | None,
        prompt_logprobs: list[Any] | None,
    ) -> EngineCoreOutput:
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            finish_reason=request.get_finished_reason(),
            stop_reason=request.stop_reason,
            num_cached_tokens=request.num_cached_tokens or 0,
            new_logprobs=new_logprobs,
            new_prompt_logprobs=prompt_logprobs,
            num_preemptions=request.num_preemptions,
            spec_decode=request.spec_decode,
        )

    # -- state for the engine loop and metrics -----------------------------------
    def has_unfinished_requests(self) -> bool:
        return len(self.running) + len(self.waiting) > 0

    def has_finished_requests(self) -> bool:
        """Whether finished ids are waiting to be sent to the worker by the next step."""
        return bool(self.finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        prefix = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_requests=prefix.requests,
            prefix_cache_queries=prefix.queries,
            prefix_cache_hits=prefix.hits,
            num_preemptions=self.num_preemptions,
            spec_decoding_stats=self.spec.stats.copy() if self.spec else None,
        )
