"""AsyncLLM against a scripted fake engine (no model): batching, aborts, faults, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from minivllm.engine.async_llm import (
    AsyncLLM,
    EngineDeadError,
    EngineError,
    EngineShutdownError,
    IterationStats,
)
from minivllm.engine.input_processor import ValidatedRequest
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.stats import SchedulerStats


class FakeEngine:
    """One token per request per step; records what the loop asked of it."""

    def __init__(self, step_s: float = 0.005) -> None:
        self.step_s = step_s
        self.remaining: dict[str, int] = {}
        self.generated: dict[str, int] = {}
        self.batches: list[set[str]] = []
        self.aborted: list[str] = []
        self.fail_next_step = False
        self.thread_ids: set[int] = set()
        self.vllm_config = None
        self.model_config = None

    def process_inputs(
        self, prompt: list[int], params: SamplingParams, priority: int = 0
    ) -> ValidatedRequest:
        if params.max_tokens is not None and len(prompt) + params.max_tokens > 100:
            raise ValueError("max_model_len is 100")
        return ValidatedRequest(None, list(prompt), params.clone(), priority)

    def add_request(self, request_id, prompt, params=None, priority=0):  # noqa: ANN001
        self.thread_ids.add(threading.get_ident())
        if isinstance(prompt, str) and prompt == "bad":
            raise ValueError("bad prompt")
        if isinstance(prompt, ValidatedRequest):
            params = prompt.params
        self.remaining[request_id] = params.max_tokens
        self.generated[request_id] = 0
        return request_id

    def has_started(self, request_id: str) -> bool:
        return self.generated.get(request_id, 0) > 0

    def is_healthy(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def _output(self, rid: str, new: int, reason: str | None) -> RequestOutput:
        done = reason is not None
        completion = CompletionOutput(0, "x" * new, [7] * new, None, None, reason)
        return RequestOutput(rid, None, [1, 2, 3], None, [completion], done)

    def step(self) -> list[RequestOutput]:
        self.thread_ids.add(threading.get_ident())
        time.sleep(self.step_s)
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("boom")
        self.batches.append(set(self.remaining))
        outputs = []
        for rid in list(self.remaining):
            self.remaining[rid] -= 1
            self.generated[rid] += 1
            reason = "length" if self.remaining[rid] == 0 else None
            if reason:
                del self.remaining[rid]
            outputs.append(self._output(rid, 1, reason))
        return outputs

    def abort_request(self, request_ids):  # noqa: ANN001
        self.thread_ids.add(threading.get_ident())
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        outs = []
        for rid in ids:
            if rid in self.remaining:
                del self.remaining[rid]
                self.aborted.append(rid)
                outs.append(self._output(rid, 0, "abort"))
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.remaining)

    def get_stats(self) -> SchedulerStats:
        n = len(self.remaining)
        return SchedulerStats(n, 0, n / 100, 0, 0, 0, 0)


class Recorder:
    def __init__(self) -> None:
        self.iterations: list[IterationStats] = []
        self.last: SchedulerStats | None = None

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        self.last = scheduler_stats
        self.iterations.append(iteration_stats)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)


async def collect(
    llm: AsyncLLM, rid: str, max_tokens: int, prompt=(1, 2, 3)
) -> list[RequestOutput]:  # noqa: ANN001
    return [o async for o in llm.generate(list(prompt), params(max_tokens), rid)]


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


def test_concurrent_requests_share_steps_and_finish(fake: FakeEngine) -> None:
    recorder = Recorder()
    llm = AsyncLLM(fake, stat_loggers=[recorder])

    async def main() -> list[list[RequestOutput]]:
        first = asyncio.create_task(collect(llm, "a", 20))
        await asyncio.sleep(0.03)  # "b" arrives while "a" is running
        return await asyncio.gather(first, collect(llm, "b", 5), collect(llm, "c", 1))

    results = asyncio.run(main())
    llm.shutdown()
    assert [sum(len(o.outputs[0].token_ids) for o in r) for r in results] == [20, 5, 1]
    assert all(r[-1].finished and r[-1].outputs[0].finish_reason == "length" for r in results)
    # Continuous batching: a later request ran in the same step as the earlier one.
    assert any({"a", "b"} <= batch for batch in fake.batches)
    # Only the engine thread ever touched the engine.
    assert fake.thread_ids == {llm._thread.ident}
    assert sum(it.num_generation_tokens for it in recorder.iterations) == 26
    assert sum(it.num_prompt_tokens for it in recorder.iterations) == 9
    finished = [f for it in recorder.iterations for f in it.finished_requests]
    assert sorted(f.num_generation_tokens for f in finished) == [1, 5, 20]
    assert sum(len(it.time_to_first_tokens) for it in recorder.iterations) == 3


def test_leaving_the_stream_aborts_the_request(fake: FakeEngine) -> None:
    llm = AsyncLLM(fake)

    async def main() -> None:
        async for _ in llm.generate([1], params(50), "gone"):
            break  # the client went away after one token
        for _ in range(200):
            if "gone" in fake.aborted:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    llm.shutdown()
    assert fake.aborted == ["gone"]
    assert not fake.has_unfinished_requests()


def test_cancelled_task_aborts_and_explicit_abort_ends_stream(fake: FakeEngine) -> None:
    recorder = Recorder()
    llm = AsyncLLM(fake, stat_loggers=[recorder])

    async def main() -> list[RequestOutput]:
        task = asyncio.create_task(collect(llm, "cancelled", 60))
        await asyncio.sleep(0.05)
        task.cancel()
        other = asyncio.create_task(collect(llm, "aborted", 60))
        await asyncio.sleep(0.05)
        await llm.abort("aborted")
        return await other

    outputs = asyncio.run(main())
    llm.shutdown()
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
    assert set(fake.aborted) == {"cancelled", "aborted"}
    reasons = [f.finish_reason for it in recorder.iterations for f in it.finished_requests]
    assert sorted(reasons) == ["abort", "abort"]  # aborts reach the metrics too
    assert recorder.last is not None and recorder.last.num_running_reqs == 0


def test_failed_step_fails_streams_and_server_keeps_going(fake: FakeEngine) -> None:
    llm = AsyncLLM(fake)

    async def main() -> list[RequestOutput]:
        task = asyncio.create_task(collect(llm, "victim", 30))
        await asyncio.sleep(0.03)
        fake.fail_next_step = True
        with pytest.raises(EngineError, match="boom"):
            await asyncio.wait_for(task, 5)
        return await asyncio.wait_for(collect(llm, "next", 3), 5)

    outputs = asyncio.run(main())
    llm.shutdown()
    assert "victim" in fake.aborted  # its blocks were released
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert not llm.errored


def test_invalid_requests_raise_for_that_client_only(fake: FakeEngine) -> None:
    llm = AsyncLLM(fake)

    async def main() -> None:
        with pytest.raises(ValueError, match="max_model_len"):
            await collect(llm, "long", 99)
        with pytest.raises(ValueError, match="bad prompt"):  # raised by the engine thread
            async for _ in llm.generate("bad", params(2), "bad"):
                pass
        assert len(await collect(llm, "fine", 2)) == 2

    asyncio.run(main())
    llm.shutdown()


def test_shutdown_lets_short_requests_finish_and_aborts_the_rest() -> None:
    fake = FakeEngine(step_s=0.01)
    llm = AsyncLLM(fake)

    async def main() -> tuple[list[RequestOutput], list[RequestOutput]]:
        short = asyncio.create_task(collect(llm, "short", 5))
        long = asyncio.create_task(collect(llm, "long", 10_000 // 100))
        await asyncio.sleep(0.02)
        start = time.monotonic()
        shutdown = asyncio.create_task(asyncio.to_thread(llm.shutdown, 0.3))
        await asyncio.sleep(0.01)
        with pytest.raises(EngineShutdownError):
            await collect(llm, "late", 1)
        results = await asyncio.gather(short, long)
        await shutdown
        assert 0.25 <= time.monotonic() - start < 3.0
        return results

    fake.process_inputs = (  # type: ignore[method-assign]
        lambda ids, p, priority=0: ValidatedRequest(None, list(ids), p, priority)
    )
    short, long = asyncio.run(main())
    assert short[-1].outputs[0].finish_reason == "length"
    assert long[-1].outputs[0].finish_reason == "abort"
    assert not llm._thread.is_alive()


def test_dead_loop_fails_waiting_clients_and_new_requests() -> None:
    fake = FakeEngine()
    fake.get_stats = None  # type: ignore[assignment]  # not used: no stat loggers
    llm = AsyncLLM(fake)

    def broken_has_unfinished() -> bool:
        raise SystemError("engine state corrupted")

    async def main() -> None:
        task = asyncio.create_task(collect(llm, "r1", 50))
        await asyncio.sleep(0.03)
        fake.has_unfinished_requests = broken_has_unfinished  # type: ignore[method-assign]
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(task, 5)
        assert llm.errored
        with pytest.raises(EngineDeadError):
            await collect(llm, "r2", 1)

    asyncio.run(main())


def test_a_validated_request_is_not_validated_again(fake: FakeEngine) -> None:
    calls: list[list[int]] = []
    real = fake.process_inputs

    def counting(prompt, params, priority=0):  # noqa: ANN001, ANN202
        calls.append(list(prompt))
        return real(prompt, params, priority)

    fake.process_inputs = counting  # type: ignore[method-assign]
    added: list[object] = []
    real_add = fake.add_request
    fake.add_request = lambda rid, prompt, *a, **k: (  # type: ignore[method-assign]
        added.append(prompt) or real_add(rid, prompt, *a, **k)
    )
    llm = AsyncLLM(fake)

    async def main() -> None:
        checked = llm.process_inputs([1, 2, 3], params(2))
        outs = [o async for o in llm.generate(checked, None, "v")]
        assert outs[-1].finished and len(calls) == 1  # generate took it as it was
        await collect(llm, "w", 2)  # token ids: validated once, by generate
        assert len(calls) == 2

    asyncio.run(main())
    llm.shutdown()
    # The engine thread received the validated requests themselves.
    assert all(isinstance(p, ValidatedRequest) for p in added) and len(added) == 2
