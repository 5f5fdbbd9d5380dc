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

from minivllm.kv_cache.blocks import KVCacheBlocks
from minivllm.kv_cache.manager import KVCacheManager
from minivllm.kv_transfer.base import KVConnectorScheduler
from minivllm.logger import init_logger
from minivllm.math_utils import cdiv
from minivllm.scheduler.config_view import SchedulingConfig
from minivllm.scheduler.options import SchedulerOptions
from minivllm.scheduler.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from minivllm.scheduler.remote_kv import RemoteKV, count_prompt_sources
from minivllm.scheduler.request import Request, RequestStatus, check_stop
from minivllm.scheduler.request_queue import make_request_queue
from minivllm.scheduler.spec_decode import SpecDecodeState
from minivllm.scheduler.step import StepPlan
from minivllm.stats import PromptTokenStats, SchedulerStats

logger = init_logger(__name__)


class Scheduler:
    """Decides each step's batch and applies the model's results to the requests."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        options: SchedulerOptions,
        connector: KVConnectorScheduler | None = None,
        kv_load_failure_policy: str = "fail",
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.options = options
        """Limits and policies (validated when the options were made)."""
        self.remote_kv = (
            None
            if connector is None
            else RemoteKV(connector, kv_cache_manager, kv_load_failure_policy)
        )
        """The KV connector's requests in flight (None: no connector)."""
        self.prompt_token_stats = PromptTokenStats()
        self._init_request_state()
        self.spec = self._make_spec_decode_state()
        """Speculative decoding: draft limits, rollback, acceptance counts (None: off)."""

    def _init_request_state(self) -> None:
        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(self.options.policy)
        self.running: list[Request] = []
        # Ids the worker must forget at the next step (finished, aborted, preempted).
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        # Requests the scheduler finished itself while scheduling, reported after the step.
        self._pending_outputs: list[EngineCoreOutput] = []
        # Batches scheduled but not yet updated: id of the SchedulerOutput -> (it, requests).
        self._in_flight: dict[int, tuple[SchedulerOutput, list[Request]]] = {}

    def _make_spec_decode_state(self) -> SpecDecodeState | None:
        opts = self.options
        if not opts.num_speculative_tokens:
            return None
        return SpecDecodeState(
            self.kv_cache_manager,
            num_speculative_tokens=opts.num_speculative_tokens,
            num_lookahead_tokens=opts.num_lookahead_tokens,
            disable_batch_size=opts.spec_disable_batch_size,
            max_model_len=opts.max_model_len,
        )

    @classmethod
    def from_config(
        cls,
        vllm_config: SchedulingConfig,
        num_blocks: int,
        kv_group_windows: Sequence[int | None] = (None,),
        *,
        send_sampled_tokens: bool = False,
    ) -> Scheduler:
        """Build the scheduler and its KV cache manager from a resolved `VllmConfig`;
        ``kv_group_windows``: the sliding window of each KV cache group (the worker's
        `KVCacheGroups.windows`; one full-attention group by default);
        ``send_sampled_tokens``: see `SchedulerOptions` (the engine knows its ranks)."""
        options = SchedulerOptions.from_config(vllm_config, send_sampled_tokens=send_sampled_tokens)
        cache = vllm_config.cache_config
        if cache.block_size is None:
            raise ValueError("cache_config.block_size is unset; resolve the VllmConfig first.")
        events = getattr(vllm_config, "kv_events_config", None)  # optional, as in vLLM
        manager = KVCacheManager(
            num_blocks=num_blocks,
            block_size=cache.block_size,
            enable_caching=cache.enable_prefix_caching,
            hash_algo=cache.prefix_caching_hash_algo,
            max_model_len=options.max_model_len,
            group_windows=kv_group_windows,
            max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            enable_kv_cache_events=bool(events and events.enable_kv_cache_events),
        )
        from minivllm.kv_transfer.scheduler_side import make_scheduler_connector

        connector = make_scheduler_connector(vllm_config)
        kv = getattr(vllm_config, "kv_transfer_config", None)
        policy = kv.kv_load_failure_policy if kv is not None else "fail"
        return cls(manager, options, connector, policy)

    # -- requests in and out ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request the engine validated (`check_request` and the engine's own
        rules); an invalid one here is a bug, so it only asserts."""
        rid = request.request_id
        assert rid not in self.requests, f"request id {rid!r} is already in use"
        # <=: a pooling request may fill the context (it generates nothing).
        assert request.num_prompt_tokens <= self.options.max_model_len, "prompt not validated"
        assert request.num_prompt_tokens <= self.kv_cache_manager.max_num_tokens, (
            "prompt not validated"
        )
        if request.max_tokens is None:
            request.max_tokens = max(1, self.options.max_model_len - request.num_prompt_tokens)
        if request.block_hasher is None and (
            self.kv_cache_manager.enable_caching or self.remote_kv is not None
        ):
            request.block_hasher = self.kv_cache_manager.block_hasher
            request.update_block_hashes()
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.waiting.add(request)

    def check_request(self, num_prompt_tokens: int, priority: int = 0, n: int = 1) -> None:
        """ValueError for a request this scheduler could never run: the scheduling half
        of the engine's request validation (pure and thread-safe).  ``n``: completions
        of the prompt, each holding its own KV blocks."""
        opts = self.options
        if not opts.enable_chunked_prefill and num_prompt_tokens > opts.max_num_batched_tokens:
            raise ValueError(
                f"The prompt ({num_prompt_tokens} tokens) exceeds "
                f"max_num_batched_tokens ({opts.max_num_batched_tokens}) and chunked prefill "
                "is disabled; enable chunked prefill or raise max_num_batched_tokens."
            )
        capacity = self.kv_cache_manager.max_num_tokens
        if n == 1 and num_prompt_tokens > capacity:
            raise ValueError(
                f"The prompt ({num_prompt_tokens} tokens) does not fit in the whole KV "
                f"cache ({capacity} tokens); shorten it or give the KV cache more memory."
            )
        if n * num_prompt_tokens > capacity:
            raise ValueError(
                f"n={n} completions of a {num_prompt_tokens}-token prompt need "
                f"{n * num_prompt_tokens} tokens of KV cache, but the whole cache holds "
                f"{capacity} tokens; lower n or shorten the prompt"
            )
        if priority != 0 and opts.policy != "priority":
            raise ValueError(
                f"priority {priority} needs the 'priority' scheduling policy, but the policy "
                f"is {opts.policy!r}; use policy 'priority' or leave priority at 0."
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
            elif request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                assert self.remote_kv is not None
                self.remote_kv.abort(request)  # its blocks go when the load ends
                request.status = status
                del self.requests[rid]
                self.finished_req_ids.add(rid)
                continue
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        if self.remote_kv is not None:
            request.kv_transfer_params_out = self.remote_kv.finished(request)
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.forget(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    # -- one step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens, allocating (and if needed preempting) KV blocks."""
        if self.remote_kv is not None:
            self._admit_loaded(self.remote_kv)
        step = self._plan_step()
        self._schedule_running(step)
        # A preemption means the cache is full: admitting new work would only thrash.
        if not step.preempted_any:
            self._schedule_waiting(step)
        if __debug__:  # asserts only: skipped whole under python -O
            step.check_invariants(self.running, self.options.max_num_seqs)
        output = self._make_output_of(step)
        self.finished_req_ids = set()
        # Scheduled tokens count as computed from now on, so the next schedule() (which may
        # run before this step's results arrive in a pipelined engine) does not repeat them.
        scheduled = step.scheduled
        for request in scheduled:
            request.num_computed_tokens += step.num_scheduled[request.request_id]
            request.num_in_flight_batches += 1
        if scheduled:
            self._in_flight[id(output)] = (output, scheduled)
        if self.remote_kv is not None:
            output.kv_connector_metadata = self.remote_kv.build_meta(scheduled)
        return output

    def _admit_loaded(self, remote_kv: RemoteKV) -> None:
        """Requests whose KV load ended go back to the front of the queue; those whose
        load failed end with the error."""
        ready, failed = remote_kv.collect()
        for request in reversed(ready):
            self.waiting.add_preempted(request)
        for request, error in failed:
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request)
            output = self._make_output(request, [], None, None)
            output.error = f"loading the request's KV cache failed: {error}"
            self._pending_outputs.append(output)

    def _plan_step(self) -> StepPlan:
        opts = self.options
        active = len(self.running) + len(self.waiting)
        # Several batches in flight: each takes its share, so that every stage has work.
        max_reqs = opts.max_num_seqs
        if opts.max_concurrent_batches > 1:
            max_reqs = max(1, cdiv(active, opts.max_concurrent_batches))
        use_spec = self.spec is not None and self.spec.speculating(active)
        return StepPlan(opts.max_num_batched_tokens, max_reqs, use_spec)

    def _schedule_running(self, step: StepPlan) -> None:
        """Decodes and the rest of chunked prefills, oldest first, preempting as needed."""
        idx = 0
        while idx < len(self.running) and step.has_room():
            request = self.running[idx]
            num_new = self._running_tokens(request, step)
            if num_new <= 0:
                idx += 1
                continue
            blocks = self._allocate(request, num_new)
            if blocks is None and request.request_id in step.spec_tokens:
                # Drafts are optional: without them the request may still fit.
                num_new -= len(step.spec_tokens.pop(request.request_id))
                blocks = self._allocate(request, num_new)
            if blocks is None:
                blocks, idx = self._preempt_until_allocated(request, num_new, idx, step)
            if blocks is None:
                continue  # it left self.running; self.running[idx] is now the next request
            step.add_running(request, num_new, blocks)
            idx += 1

    def _running_tokens(self, request: Request, step: StepPlan) -> int:
        """Tokens to compute for a running request: its remaining work, capped, plus the
        drafts to verify when it decodes (recorded in ``step.spec_tokens``)."""
        remaining = request.num_tokens - request.num_computed_tokens
        num_new = min(self._cap_long_prefill(remaining), step.budget)
        spec = self.spec
        drafts = spec.drafts_to_verify(request, step.budget) if spec and step.use_spec else []
        request.spec_token_ids = []
        if drafts and num_new == 1:
            step.spec_tokens[request.request_id] = drafts
            num_new += len(drafts)
        return num_new

    def _preempt_until_allocated(
        self, request: Request, num_new: int, idx: int, step: StepPlan
    ) -> tuple[KVCacheBlocks | None, int]:
        """Preempt victims until ``request``'s slots fit.  Returns its new blocks (None
        when it left the running list itself) and its index in the list after the
        victims before it left."""
        blocks = None
        while blocks is None:
            victim = self._pick_victim()
            if victim is request and len(self.running) == 1:
                # Alone and still short: its context outgrew the whole KV cache.
                self._finish_out_of_kv_cache(request)
                step.spec_tokens.pop(request.request_id, None)
                return None, idx
            victim_idx = self.running.index(victim)
            del self.running[victim_idx]
            if victim_idx < idx:
                idx -= 1
            # Undo its place in this step before freeing its blocks.
            step.remove_running(victim)
            self._preempt(victim)
            step.preempted_any = True
            if victim is request:
                return None, idx
            blocks = self._allocate(request, num_new)
        return blocks, idx

    def _schedule_waiting(self, step: StepPlan) -> None:
        """Admit waiting requests in policy order while the step has room."""
        step.count_partial_prefills(self.options.long_prefill_token_threshold)
        # Requests for an adapter beyond max_loras step aside (in order) for the ones
        # behind them, and come back to the front of the queue after this step.
        skipped: list[Request] = []
        while (
            len(self.waiting) > 0
            and step.has_room()
            and len(self.running) < self.options.max_num_seqs
        ):
            if not self._lora_fits(self.waiting.peek()):
                skipped.append(self.waiting.pop())
            elif not self._try_add_waiting(self.waiting.peek(), step):
                break
        for request in reversed(skipped):
            self.waiting.add_preempted(request)

    def _try_add_waiting(self, request: Request, step: StepPlan) -> bool:
        """Admit the head of the waiting queue (or finish it when it can never fit).
        False when it has to wait, which holds back everything behind it too."""
        opts = self.options
        if request.num_in_flight_batches:
            return False  # preempted while a batch of it ran: resume once that batch is back
        remote_kv = self.remote_kv
        if remote_kv is not None and remote_kv.holds_blocks(request):
            # Back from a load: it holds its blocks, its loaded tokens are computed.
            hit_blocks = KVCacheBlocks.empty(self.kv_cache_manager.num_groups)
            num_hit = request.num_computed_tokens
        else:
            hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            if remote_kv is not None:
                started = remote_kv.start_load(request, hit_blocks, num_hit)
                if started is not None:
                    if started:
                        self.waiting.pop()  # it waits for its KV; the next one may run
                    return started
        num_new = self._cap_long_prefill(request.num_tokens - num_hit)
        if num_new > step.budget:
            # Without chunking a prompt runs whole, so it waits for a roomier step;
            # only a recomputed context longer than any step (prompt + outputs after
            # a preemption) is split anyway, or it could never run again.
            if not opts.enable_chunked_prefill and num_new <= opts.max_num_batched_tokens:
                return False
            num_new = step.budget
        is_partial = num_hit + num_new < request.num_tokens
        is_long = is_partial and 0 < opts.long_prefill_token_threshold < request.num_tokens
        if is_partial and (
            step.num_partial >= opts.max_num_partial_prefills
            or (is_long and step.num_long_partial >= opts.max_long_partial_prefills)
        ):
            return False
        blocks = None
        if not opts.reserve_full_isl or self.kv_cache_manager.can_allocate(
            request, request.num_tokens - num_hit, hit_blocks
        ):
            blocks = self._allocate(request, num_new, hit_blocks)
        if blocks is None:
            if self.running or (
                remote_kv is not None and remote_kv.holds_blocks_for_loads(self.waiting)
            ):
                return False  # blocks come back as running (or loading) requests finish
            # Every block is free and it still does not fit: it never will.
            self.waiting.pop()
            self.running.append(request)
            self._finish_out_of_kv_cache(request)
            return True
        self.waiting.pop()
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_hit
            external = self.remote_kv.external_tokens.get(request.request_id, 0) if remote_kv else 0
            count_prompt_sources(self.prompt_token_stats, request, num_hit, external)
        step.add_new(request, num_new, is_partial, is_long)
        return True

    def _lora_fits(self, request: Request) -> bool:
        """Whether the running batch has room for the request's adapter (always, for
        the base model or an adapter already running)."""
        max_loras = self.options.max_loras
        if max_loras is None or request.lora_int_id == 0:
            return True
        running = {r.lora_int_id for r in self.running} - {0}
        return request.lora_int_id in running or len(running) < max_loras

    def _allocate(
        self, request: Request, num_new: int, hits: KVCacheBlocks | None = None
    ) -> KVCacheBlocks | None:
        return self.kv_cache_manager.allocate_slots(
            request, num_new, hits, num_lookahead_tokens=self.options.num_lookahead_tokens
        )

    def _make_output_of(self, step: StepPlan) -> SchedulerOutput:
        spec = self.spec
        running = step.running
        return SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(r) for r in step.new],
            scheduled_cached_reqs=CachedRequestData(
                req_ids=[r.request_id for r in running],
                new_block_ids=[step.new_blocks[r.request_id].flat_block_ids() for r in running],
                num_computed_tokens=[r.num_computed_tokens for r in running],
                num_kept_blocks=[
                    spec.kept_blocks.pop(r.request_id, None) if spec else None for r in running
                ],
                new_token_ids=[self._unsent_tokens(r) for r in running]
                if self.options.send_sampled_tokens
                else [],
            ),
            num_scheduled_tokens=step.num_scheduled,
            total_num_scheduled_tokens=sum(step.num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            scheduled_spec_decode_tokens=step.spec_tokens,
            num_spec_tokens_to_propose=spec.num_speculative_tokens if spec and step.use_spec else 0,
        )

    def return_unsent(self, scheduler_output: SchedulerOutput) -> None:
        """The engine will not send this empty output: its finished ids go with the next."""
        assert scheduler_output.is_empty, "only an empty output may be held back"
        self.finished_req_ids |= scheduler_output.finished_req_ids

    @staticmethod
    def _unsent_tokens(request: Request) -> list[int]:
        tokens = request.output_token_ids[request.num_output_tokens_sent :]
        request.num_output_tokens_sent = request.num_output_tokens
        return tokens

    def _cap_long_prefill(self, num_new: int) -> int:
        """At most ``long_prefill_token_threshold`` tokens of one prefill per step."""
        threshold = self.options.long_prefill_token_threshold
        return threshold if 0 < threshold < num_new else num_new

    def _pick_victim(self) -> Request:
        if self.options.policy == "priority":
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
            lora_request=request.lora_request,
            pooling_params=request.pooling_params,
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
        if self.remote_kv is not None:
            self.remote_kv.record(model_runner_output.kv_connector_output)
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
            pooled = model_runner_output.pooler_output.get(rid)
            if pooled is not None:  # a pooling request: done after its prompt
                request.status = RequestStatus.FINISHED_STOPPED
            new_token_ids: list[int] = []
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid)
            if drafts and sampled and self.spec is not None:
                self.spec.roll_back(request, len(drafts), len(sampled) - 1)
            # Tokens sampled in the middle of a chunked prefill are meaningless.
            if sampled and request.num_computed_tokens >= request.num_tokens:
                for token_id in sampled:
                    request.append_output_token_ids(token_id)
                    new_token_ids.append(token_id)
                    if check_stop(request, self.options.max_model_len):
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
                outputs[-1].pooling_output = pooled
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
            kv_transfer_params=request.kv_transfer_params_out,
        )

    # -- state for the engine loop and metrics -----------------------------------
    def has_unfinished_requests(self) -> bool:
        loading = self.remote_kv is not None and self.remote_kv.has_work()
        return len(self.running) + len(self.waiting) > 0 or loading

    def has_finished_requests(self) -> bool:
        """Whether finished ids are waiting to be sent to the worker by the next step."""
        return bool(self.finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        loading = len(self.remote_kv.loading) if self.remote_kv is not None else 0
        return len(self.running) + len(self.waiting) + loading

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
            running_lora_adapters=_count_adapters(self.running),
            waiting_lora_adapters=_count_adapters(self.waiting),
            prompt_token_stats=PromptTokenStats(**vars(self.prompt_token_stats)),
            kv_connector_stats=self.remote_kv.cumulative_stats() if self.remote_kv else None,
        )


def _count_adapters(requests: Iterable[Request]) -> dict[str, int]:
    """LoRA adapter name -> how many of ``requests`` use it."""
    counts: dict[str, int] = {}
    for request in requests:
        if request.lora_request is not None:
            name = request.lora_request.lora_name
            counts[name] = counts.get(name, 0) + 1
    return counts
