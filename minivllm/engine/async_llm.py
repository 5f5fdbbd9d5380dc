"""`AsyncLLM`: the synchronous `LLMEngine` behind an asyncio front, for the server.

The engine is not thread-safe, so exactly one thread -- the *engine loop* thread
started here -- ever touches it.  Coroutines talk to that thread through a
command queue (add, abort) and get results back through one `asyncio.Queue` per
request, filled with ``loop.call_soon_threadsafe``.  Between two engine steps the
loop drains the command queue, so requests from many HTTP clients join the running
batch as they arrive (continuous batching) while the event loop stays free to
accept connections and stream tokens: a step runs in the engine thread, and torch
releases the GIL inside its ops.

A request whose own inputs fail in the worker (e.g. its seeded generator cannot be
built) finishes alone: its stream receives an `EngineError` and the batch goes on.
A failed step never leaves a client hanging: every in-flight stream receives an
`EngineError`, their requests are aborted, and the loop carries on.  Only if the
engine cannot even be cleaned up does the front turn *dead* (``errored``), after
which every new request fails at once and ``/health`` reports it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from minivllm.engine.input_processor import PromptInput, ValidatedRequest
from minivllm.engine.llm_engine import LLMEngine
from minivllm.logger import init_logger
from minivllm.lora.request import LoRARequest
from minivllm.outputs import PoolingRequestOutput, RequestOutput
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import NO_ALLOWED_TOKEN_ERROR, RequestOutputKind, SamplingParams
from minivllm.stats import FinishedRequestStats, IterationStats, SchedulerStats
from minivllm.structured_output.spec import GRAMMAR_ERROR_PREFIX

if TYPE_CHECKING:
    from minivllm.args.engine_args import EngineArgs
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

IDLE_POLL_S = 1.0
"""How often an idle loop wakes up on its own (to notice a shutdown deadline)."""


class EngineError(RuntimeError):
    """The engine failed while serving this request (the server itself keeps running)."""


class RequestConstraintError(EngineError):
    """The request's own constraints left no token to sample, or its grammar broke a
    structured-output limit mid-generation (a client error: the server answers 400)."""


class EngineDeadError(EngineError):
    """The engine loop has stopped for good; no request can be served."""


class EngineShutdownError(RuntimeError):
    """The engine is shutting down and accepts no new requests."""


class StatLogger(Protocol):
    """Receives the engine's statistics; called from the engine loop thread."""

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        """Take one step's statistics (must be thread-safe and fast)."""


@dataclass
class _Timing:
    """Per-completion timestamps for latency metrics."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0


@dataclass
class _Stream:
    """Where the engine loop puts a request's outputs (lives in the event loop)."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]
    delta: bool
    """Outputs carry only new tokens (RequestOutputKind.DELTA)."""
    num_prompt_tokens: int = 0
    counted_prompt: bool = False
    arrival: float = field(default_factory=time.monotonic)
    timings: dict[int, _Timing] = field(default_factory=dict)
    scheduled: float | None = None
    """Start of the first step that computed tokens of this request."""
    n: int = 1
    max_tokens: int | None = None


@dataclass(frozen=True)
class AddRequest:
    """Engine-thread command: queue a request; its outputs go to ``stream``."""

    request_id: str
    prompt: ValidatedRequest | PromptInput
    """Validated already, or a text prompt the engine thread tokenizes and validates."""
    params: SamplingParams
    priority: int
    stream: _Stream


@dataclass(frozen=True)
class AbortRequest:
    """Engine-thread command: abort a request (ignored once it has finished)."""

    request_id: str


EngineCommand = AddRequest | AbortRequest


class AsyncLLM:
    """An asyncio front for one `LLMEngine`, driven by a background engine thread.

    ``async for output in async_llm.generate(prompt, params, request_id)`` yields the
    request's `RequestOutput`s as they are produced (deltas when params.output_kind is
    DELTA).  Leaving the loop early (a client disconnecting, a cancelled task) aborts
    the request and frees its KV blocks before the next step.
    """

    def __init__(self, engine: LLMEngine, stat_loggers: list[StatLogger] | None = None) -> None:
        self.engine = engine
        self.stat_loggers = list(stat_loggers or [])
        self._commands: collections.deque[EngineCommand] = collections.deque()
        self._wakeup = threading.Event()
        # Only the engine thread reads or writes this dict.
        self._streams: dict[str, _Stream] = {}
        self._accepting = True
        self._drain_deadline: float | None = None
        self._stop = False
        self._dead: BaseException | None = None
        self._step_start = time.monotonic()
        self._thread = threading.Thread(target=self._run_loop, name="minivllm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, **kwargs: Any) -> AsyncLLM:
        return cls(LLMEngine.from_engine_args(engine_args), **kwargs)

    # -- state ----------------------------------------------------------------
    @property
    def errored(self) -> bool:
        """True once the engine loop has died (every request fails from then on)."""
        if self._dead is not None or not self._thread.is_alive() and not self._stop:
            return True
        # A worker process that died between steps: report it before a request finds out.
        return not self.engine.is_healthy()

    @property
    def is_accepting(self) -> bool:
        return self._accepting and not self.errored

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    @property
    def model_config(self) -> ModelConfig:
        return self.engine.model_config

    @property
    def vllm_config(self) -> VllmConfig:
        return self.engine.vllm_config

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks of the engine's cache."""
        return self.engine.scheduler.kv_cache_manager.block_pool.num_blocks

    def process_inputs(
        self,
        prompt: PromptInput,
        params: SamplingParams,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> ValidatedRequest:
        """Validate a token-id request before it is sent (pure, thread-safe): the
        engine's ValueError for a request it could never finish."""
        if lora_request is None:
            return self.engine.process_inputs(prompt, params, priority)
        return self.engine.process_inputs(prompt, params, priority, lora_request)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check an adapter so requests can name it (ValueError saying why not)."""
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter's check (its loaded weights age out of the worker's LRU)."""
        return self.engine.remove_lora(lora_int_id)

    def process_pooling(
        self, prompt: PromptInput, params: PoolingParams, task: str
    ) -> ValidatedRequest:
        """Validate a pooling request (pure, thread-safe); `generate` then runs it and
        yields its one `PoolingRequestOutput`."""
        return self.engine.input_processor.process_pooling(prompt, params, task)

    # -- requests -------------------------------------------------------------
    async def generate(
        self,
        prompt: PromptInput | ValidatedRequest,
        sampling_params: SamplingParams | None,
        request_id: str,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs until it finishes.

        ``prompt``: a `ValidatedRequest` (from `process_inputs`; ``sampling_params``
        and ``priority`` are then its own), token ids (validated here) or text
        (tokenized and validated by the engine thread, which holds the tokenizer).
        Raises `EngineShutdownError` when shutting down, `EngineDeadError` when the
        loop has died, ValueError for an invalid request, `EngineError` when a step
        failed while this request was running.
        """
        self._check_accepting()
        if not isinstance(prompt, ValidatedRequest) and not _is_text(prompt):
            assert sampling_params is not None
            prompt = self.process_inputs(prompt, sampling_params, priority)
        if isinstance(prompt, ValidatedRequest):
            sampling_params, priority = prompt.params, prompt.priority
        assert sampling_params is not None
        stream = _Stream(
            request_id,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            delta=sampling_params.output_kind == RequestOutputKind.DELTA,
            num_prompt_tokens=(
                len(prompt.prompt_token_ids) if isinstance(prompt, ValidatedRequest) else 0
            ),
            n=sampling_params.n,
            max_tokens=sampling_params.max_tokens,
        )
        self._send(AddRequest(request_id, prompt, sampling_params, priority, stream))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine side already dropped it
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._send(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with finish_reason "abort"."""
        self._send(AbortRequest(request_id))

    def _check_accepting(self) -> None:
        if self.errored:
            raise EngineDeadError(f"the engine loop has stopped: {self._dead!r}")
        if not self._accepting:
            raise EngineShutdownError("the server is shutting down and takes no new requests")

    def _send(self, command: EngineCommand) -> None:
        self._commands.append(command)
        self._wakeup.set()

    # -- shutdown -------------------------------------------------------------
    def begin_shutdown(self, timeout: float) -> None:
        """Stop accepting; requests still running after ``timeout`` seconds are aborted.

        Thread-safe and non-blocking (a signal handler may call it).
        """
        self._accepting = False
        deadline = time.monotonic() + max(0.0, timeout)
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline
        self._wakeup.set()

    def shutdown(self, timeout: float = 0.0) -> None:
        """Stop accepting, let running requests finish for up to ``timeout`` seconds, abort
        the rest, then stop the engine thread.  Blocks; call via asyncio.to_thread."""
        if self._drain_deadline is None:
            self.begin_shutdown(timeout)
        self._stop = True
        self._wakeup.set()
        self._thread.join()
        self.engine.shutdown()  # worker processes, if the executor has any

    # -- the engine thread ----------------------------------------------------
    def _run_loop(self) -> None:
        engine = self.engine
        try:
            while True:
                stats = IterationStats()
                changed = self._process_commands(stats)
                if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                    changed |= self._abort_all("shutdown timeout reached", stats)
                if changed:
                    self._record(stats)
                if engine.has_unfinished_requests():
                    self._step()
                    continue
                if self._stop:
                    return
                self._wakeup.wait(IDLE_POLL_S)
                self._wakeup.clear()
        except BaseException as exc:  # the loop itself broke: nothing can be served now
            logger.exception("engine loop died")
            self._dead = exc
            error = EngineDeadError(f"engine loop died: {exc!r}")
            self._fail_streams(list(self._streams), error)
            # Requests queued but never added would otherwise wait forever.
            while self._commands:
                command = self._commands.popleft()
                if isinstance(command, AddRequest):
                    self._put(command.stream, [error])

    def _process_commands(self, stats: IterationStats) -> bool:
        changed = False
        while self._commands:
            command = self._commands.popleft()
            changed = True
            if isinstance(command, AddRequest):
                self._add(command)
            elif isinstance(command, AbortRequest):
                self._abort([command.request_id], stats)
            else:
                raise TypeError(f"unknown engine command {command!r}")
        return changed

    def _add(self, command: AddRequest) -> None:
        request_id, stream = command.request_id, command.stream
        if not self._accepting and self._drain_deadline is not None:
            self._put(stream, [EngineShutdownError("the server is shutting down")])
            return
        try:
            if isinstance(command.prompt, ValidatedRequest):
                self.engine.add_request(request_id, command.prompt)
            else:  # a text prompt: tokenized and validated here, by the engine thread
                self.engine.add_request(
                    request_id, command.prompt, command.params, priority=command.priority
                )
        except Exception as exc:  # invalid request: only this client hears about it
            self._put(stream, [exc])
            return
        if not stream.num_prompt_tokens:
            parent = self.engine.output_processor.parents.get(request_id)
            stream.num_prompt_tokens = len(parent.prompt_token_ids) if parent else 0
        self._streams[request_id] = stream

    def _abort(self, request_ids: list[str], stats: IterationStats) -> None:
        live = [r for r in request_ids if r in self._streams]
        if live:
            self._deliver(self.engine.abort_request(live), stats)

    def _abort_all(self, why: str, stats: IterationStats) -> bool:
        if not self._streams:
            return False
        logger.info("aborting %d running request(s): %s", len(self._streams), why)
        self._abort(list(self._streams), stats)
        return True

    def _step(self) -> None:
        self._step_start = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            logger.exception("engine step failed; failing its %d request(s)", len(self._streams))
            ids = list(self._streams)
            self._fail_streams(ids, EngineError(f"engine step failed: {exc!r}"))
            if not self.engine.is_healthy():
                raise  # a worker is gone: the loop dies and /health turns 503
            # Aborting frees the failed requests' blocks so the next requests start clean;
            # if even that fails, the loop dies (handled by _run_loop).
            self.engine.abort_request(ids)
            self._record(IterationStats())
            return
        stats = IterationStats()
        self._deliver(outputs, stats)
        self._mark_scheduled()
        self._record(stats)

    def _mark_scheduled(self) -> None:
        """Note the step in which each waiting request first got tokens computed (its
        queue time ends there); a request with n > 1 runs as children ``0_<id>``, ...."""
        for rid, stream in self._streams.items():
            if stream.scheduled is None and self.engine.has_started(rid):
                stream.scheduled = self._step_start

    def _deliver(
        self, outputs: list[RequestOutput | PoolingRequestOutput], stats: IterationStats
    ) -> None:
        now = time.monotonic()
        batches: dict[
            asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput | BaseException]]
        ] = {}
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            self._account(stream, output, now, stats)
            if output.finished:
                del self._streams[output.request_id]
            item: RequestOutput | BaseException = output
            if output.finished and getattr(output, "error", None) is not None:
                # Only this request's own inputs failed; the batch carried on without it.
                error = (
                    RequestConstraintError
                    if NO_ALLOWED_TOKEN_ERROR in output.error
                    or output.error.startswith(GRAMMAR_ERROR_PREFIX)
                    else EngineError
                )
                item = error(f"request {output.request_id} failed: {output.error}")
            batches.setdefault(stream.loop, []).append((stream, item))
        for loop, items in batches.items():
            self._call_in_loop(loop, _put_all, items)

    def _account(
        self, stream: _Stream, output: RequestOutput, now: float, stats: IterationStats
    ) -> None:
        """Update per-completion timings and this step's token counts and latencies."""
        if isinstance(output, PoolingRequestOutput):  # its prompt ran; nothing generated
            stats.num_prompt_tokens += stream.num_prompt_tokens
            stream.timings[0] = _Timing(stream.arrival, now, now)
            self._finish(stream, output, now, stats)
            return
        for completion in output.outputs:
            timing = stream.timings.get(completion.index)
            if timing is None:
                timing = stream.timings[completion.index] = _Timing(stream.arrival)
            # Cumulative outputs repeat earlier tokens; count only the new ones.
            total = len(completion.token_ids)
            new_tokens = total if stream.delta else max(0, total - timing.num_tokens)
            if new_tokens:
                if timing.first_token is None:
                    timing.first_token = now
                    stats.time_to_first_tokens.append(now - timing.arrival)
                    if not stream.counted_prompt:  # once per request, whatever n is
                        stream.counted_prompt = True
                        stats.num_prompt_tokens += stream.num_prompt_tokens
                elif timing.last_token is not None:
                    stats.inter_token_latencies.append(now - timing.last_token)
                timing.last_token = now
                timing.num_tokens += new_tokens
                stats.num_generation_tokens += new_tokens
        if output.finished:  # one entry per request, whatever its n
            self._finish(stream, output, now, stats)

    def _finish(
        self, stream: _Stream, output: RequestOutput, now: float, stats: IterationStats
    ) -> None:
        timings = list(stream.timings.values())
        firsts = [t.first_token for t in timings if t.first_token is not None]
        lasts = [t.last_token for t in timings if t.last_token is not None]
        completions = output.outputs if isinstance(output, RequestOutput) else []
        reasons = [c.finish_reason for c in completions if c.finish_reason is not None]
        if isinstance(output, PoolingRequestOutput):
            reasons = ["stop"]
        reason = "abort" if "abort" in reasons else (reasons[0] if reasons else "abort")
        scheduled = stream.scheduled
        if scheduled is None and firsts:  # prefilled and finished within one step
            scheduled = self._step_start
        first = min(firsts) if firsts else None
        last = max(lasts) if lasts else None
        stats.finished_requests.append(
            FinishedRequestStats(
                reason,
                now - stream.arrival,
                stream.num_prompt_tokens,
                sum(t.num_tokens for t in timings),
                queue_time=(scheduled if scheduled is not None else now) - stream.arrival,
                prefill_time=first - scheduled if first is not None and scheduled else 0.0,
                decode_time=last - first if last and first else 0.0,
                inference_time=last - scheduled if last and scheduled else 0.0,
                n=stream.n,
                max_tokens=stream.max_tokens,
            )
        )

    def _fail_streams(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                self._call_in_loop(stream.loop, _put_all, [(stream, error)])

    def _put(self, stream: _Stream, items: list[RequestOutput | BaseException]) -> None:
        self._call_in_loop(stream.loop, _put_all, [(stream, item) for item in items])

    @staticmethod
    def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _record(self, stats: IterationStats) -> None:
        if not self.stat_loggers:
            return
        scheduler_stats = self.engine.get_stats()
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(scheduler_stats, stats)
            except Exception:  # metrics must never take the engine down
                logger.exception("stat logger %r failed", stat_logger)


def _is_text(prompt: PromptInput) -> bool:
    """A prompt the engine thread must tokenize (the tokenizer is not shared)."""
    if isinstance(prompt, dict):
        return "prompt_token_ids" not in prompt
    return isinstance(prompt, str)


def _put_all(items: list[tuple[_Stream, RequestOutput | BaseException]]) -> None:
    for stream, item in items:
        stream.queue.put_nowait(item)


__all__ = [
    "AbortRequest",
    "AddRequest",
    "AsyncLLM",
    "EngineDeadError",
    "EngineError",
    "EngineShutdownError",
    "FinishedRequestStats",
    "IterationStats",
    "StatLogger",
]
