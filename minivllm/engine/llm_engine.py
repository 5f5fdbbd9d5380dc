"""The synchronous engine: add requests, call `step()` until they finish.

One step is: the scheduler picks the tokens to compute, the executor runs them,
the scheduler updates each request, and the output processor detokenizes and
checks stop strings.  `LLM` (offline) and the async server front both drive it.

With pipeline parallelism the engine keeps up to ``max_concurrent_batches`` (one
per stage) batches in flight, as vLLM's engine core does with its batch queue: a
step schedules and submits a batch while the queue has room and there is work
that is not already in flight; otherwise it waits for the oldest batch and
applies its results.  So while stage 2 runs batch 1, stage 1 runs batch 2.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from minivllm.distributed.kv_events import EventPublisherFactory, KVEventBatch
from minivllm.engine.input_processor import InputProcessor, PromptInput, ValidatedRequest
from minivllm.engine.offline_stats import OfflineStatsCollector
from minivllm.engine.output_processor import OutputProcessor, ParentRequest
from minivllm.engine.reasoning import init_reasoning_token_ids
from minivllm.executor.factory import get_executor_class
from minivllm.logger import init_logger
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from minivllm.scheduler.request import Request, RequestStatus
from minivllm.scheduler.scheduler import Scheduler
from minivllm.stats import SchedulerStats

if TYPE_CHECKING:
    from minivllm.args.engine_args import EngineArgs
    from minivllm.config.vllm import VllmConfig
    from minivllm.structured_output.manager import StructuredOutputManager

logger = init_logger(__name__)


class LLMEngine:
    """Scheduler + executor + output processor for one model."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from minivllm.tokenizer import get_tokenizer

        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        if model_config is None:
            raise ValueError("LLMEngine needs a VllmConfig with a model_config; name a model.")
        self.model_config = model_config
        self.tokenizer = None
        if not model_config.skip_tokenizer_init:
            self.tokenizer = get_tokenizer(model_config.tokenizer or model_config.model)
        init_reasoning_token_ids(vllm_config, self.tokenizer)  # before the workers get it
        self.executor = get_executor_class(vllm_config)(vllm_config)
        parallel = vllm_config.parallel_config
        self.batch_queue: deque[tuple[SchedulerOutput, Any]] = deque()
        """Batches submitted to the executor whose results are not applied yet, oldest
        first (each with the executor's pending result); only used above one batch."""
        self.scheduler = Scheduler.from_config(
            vllm_config,
            self.executor.num_blocks,
            self.executor.kv_group_windows,
            # Only the output rank samples: the other ranks get its tokens this way.
            send_sampled_tokens=parallel.world_size > 1,
        )
        self.kv_event_publisher = EventPublisherFactory.create(
            vllm_config.kv_events_config, parallel.data_parallel_rank
        )
        """Sends the KV cache events of each step (`KVEventsConfig`)."""
        self.output_processor = OutputProcessor(
            self.tokenizer,
            vllm_config.observability_config.per_request_spec_decode_metrics,
            vllm_config.model_config,
        )
        self.input_processor = InputProcessor(vllm_config, self.tokenizer, self.scheduler)
        self.eos_token_id = self.input_processor.eos_token_id
        self._ids = itertools.count()
        # Offline statistics (LLM with disable_log_stats=False): per-step counts for the
        # stat loggers; the server's AsyncLLM keeps its own.
        self.stat_loggers: list[Any] = []
        self._offline_stats: OfflineStatsCollector | None = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args.create_engine_config())

    # -- requests -----------------------------------------------------------
    def process_inputs(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> ValidatedRequest:
        """Tokenize and validate a request (the one validation point; see
        `input_processor`).  Thread-safe for token-id prompts: the server calls it
        before a stream starts, so that a bad request gets a 400 rather than an error
        event after a 200."""
        return self.input_processor.process(prompt, params, priority, lora_request)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check an adapter ahead of its requests (vLLM's API); ValueError saying why
        it cannot be served.  The worker loads it with its first request."""
        self.input_processor.adapters.check(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget the adapter with this id; every worker drops its weights with the
        next step."""
        return self.input_processor.adapters.forget(lora_int_id)

    @property
    def structured_outputs(self) -> StructuredOutputManager:
        """The grammar compiler and cache (made on first use; needs the tokenizer)."""
        return self.input_processor.structured_outputs

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptInput | ValidatedRequest,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """Queue a request (``n`` children when params.n > 1); returns its id.

        ``prompt`` is a raw prompt (validated here, with ``params`` and ``priority``)
        or a `ValidatedRequest` from `process_inputs` (which carries both)."""
        if request_id is None:
            # Skip ids a caller chose explicitly, so generated ids never collide.
            request_id = str(next(self._ids))
            while request_id in self.output_processor.parents:
                request_id = str(next(self._ids))
        if request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(prompt, ValidatedRequest):
            assert params is None and priority == 0, "a ValidatedRequest carries its own"
            validated = prompt
        else:
            validated = self.process_inputs(prompt, params, priority, lora_request)
        params = validated.params
        child_ids = (
            [request_id] if params.n == 1 else [f"{i}_{request_id}" for i in range(params.n)]
        )
        taken = [c for c in child_ids if self.output_processor.has_request(c)]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use by another request")
        parent = ParentRequest(
            request_id, params.n, validated.prompt, validated.prompt_token_ids, params.output_kind
        )
        for index, child_id in enumerate(child_ids):
            child_params = params
            if params.n > 1:
                child_params = params.clone()
                child_params.n = 1
                if params.seed is not None:
                    child_params.seed = params.seed + index
            self.output_processor.add_request(
                parent, child_id, index, child_params, validated.pooling_params
            )
            request = Request(
                child_id,
                validated.prompt_token_ids,
                child_params,
                eos_token_id=self.eos_token_id,
                arrival_time=arrival_time,
                priority=validated.priority,
                lora_request=validated.lora_request,
            )
            request.grammar = validated.grammar
            request.pooling_params = validated.pooling_params
            self.scheduler.add_request(request)
        return request_id

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Abort requests (by the ids given to add_request); frees their KV blocks at once."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        child_ids = [c for rid in ids for c in self.output_processor.child_ids_of(rid)]
        self.scheduler.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
        return self.output_processor.abort_requests(child_ids)

    @property
    def max_concurrent_batches(self) -> int:
        """Batches kept in flight: `VllmConfig.max_concurrent_batches` (one per pipeline
        stage), held by the scheduler's options, which split work by it."""
        return self.scheduler.options.max_concurrent_batches

    # -- running ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step and return the outputs it produced."""
        if self.max_concurrent_batches > 1:
            return self._step_with_batch_queue()
        scheduler_output = self.scheduler.schedule()
        scheduler_output.removed_lora_ids = self.input_processor.adapters.take_removed()
        runner_output = self.executor.execute_model(scheduler_output)
        return self._apply(scheduler_output, runner_output)

    def _step_with_batch_queue(self) -> list[RequestOutput]:
        """Submit a batch while there is room and work; else apply the oldest batch.

        A step that only submits returns no outputs; an empty schedule is not sent
        while other batches are in flight (its finished ids go with the next batch).
        """
        queue = self.batch_queue
        if len(queue) < self.max_concurrent_batches:
            scheduler_output = self.scheduler.schedule()
            if not scheduler_output.is_empty or not queue:
                scheduler_output.removed_lora_ids = self.input_processor.adapters.take_removed()
                pending = self.executor.execute_model(scheduler_output, non_block=True)
                queue.append((scheduler_output, pending))
                if not scheduler_output.is_empty and len(queue) < self.max_concurrent_batches:
                    return []
            else:
                self.scheduler.return_unsent(scheduler_output)
        scheduler_output, pending = queue.popleft()
        return self._apply(scheduler_output, pending.result())

    def _apply(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        """Update the scheduler from one batch's results and turn them into outputs."""
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self._publish_kv_events()
        self._fail_siblings(core_outputs)
        collector = self._offline_stats
        stats = collector.observe(core_outputs, self.output_processor) if collector else None
        outputs, stopped = self.output_processor.process_outputs(core_outputs)
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if collector is not None and stats is not None:
            collector.finish(outputs, stats)
            scheduler_stats = self.get_stats()
            for stat_logger in self.stat_loggers:
                stat_logger.record(scheduler_stats, stats)
        return outputs

    def _publish_kv_events(self) -> None:
        """The KV cache events since the last call, as one batch (none: nothing sent)."""
        events = self.scheduler.kv_cache_manager.take_events()
        if events:
            self.kv_event_publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (False, changing nothing, while requests hold
        blocks); with KV events on, an `AllBlocksCleared` goes out at once."""
        ok = self.scheduler.reset_prefix_cache()
        self._publish_kv_events()
        return ok

    def add_stat_loggers(self, stat_loggers: list[Any]) -> None:
        """Have the engine itself feed ``stat_loggers`` after every step (offline use;
        the server's AsyncLLM records its own, stream-timed statistics)."""
        self.stat_loggers.extend(stat_loggers)
        if self._offline_stats is None:
            self._offline_stats = OfflineStatsCollector()

    def _fail_siblings(self, core_outputs: list[EngineCoreOutput]) -> None:
        """A failed child fails its whole request: its n > 1 siblings end with the same
        error (their blocks are freed now) instead of running for an answer nobody gets."""
        by_id = {eco.request_id: eco for eco in core_outputs}
        for failed in [eco for eco in core_outputs if eco.error is not None]:
            state = self.output_processor.states.get(failed.request_id)
            if state is None:
                continue
            for child_id in self.output_processor.child_ids_of(state.parent.request_id):
                sibling = by_id.get(child_id)
                if sibling is not None and sibling.finished:
                    continue
                self.scheduler.finish_requests([child_id], RequestStatus.FINISHED_ERROR)
                if sibling is None:
                    sibling = by_id[child_id] = EngineCoreOutput(child_id, [])
                    core_outputs.append(sibling)
                sibling.finish_reason, sibling.error = "error", failed.error

    def has_started(self, request_id: str) -> bool:
        """Whether a step has computed any token of ``request_id`` yet (its queue time
        is over); a request with n > 1 counts once its first child ``0_<id>`` has."""
        requests = self.scheduler.requests
        request = requests.get(request_id) or requests.get(f"0_{request_id}")
        return request is not None and request.num_computed_tokens > 0

    def is_healthy(self) -> bool:
        """False once the executor lost a worker (no step can run any more)."""
        return bool(self.executor.is_healthy())

    def shutdown(self) -> None:
        """Stop the executor's workers (a no-op for the in-process one) and the KV event
        publisher."""
        self.executor.shutdown()
        self.kv_event_publisher.shutdown()

    def has_unfinished_requests(self) -> bool:
        """Requests still running or waiting, or batches whose results are still due."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def get_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("this engine was started with skip_tokenizer_init=True")
        return self.tokenizer
