"""`DPAsyncLLM`: the server's engine with ``data_parallel_size`` replicas behind it.

It has `AsyncLLM`'s interface (the server cannot tell the two apart): each
replica runs under its own `AsyncLLM` (one engine thread per replica, driving a
`RemoteEngine`), so streaming, aborts, request timings and the per-engine
statistics are the one-engine code; this class validates a request in front,
asks the `LoadBalancer` which replica takes it, and hands it to that replica's
`AsyncLLM`.

A replica that dies fails its own requests (their streams get an `EngineError`
that names the replica) and is routed no more; the others go on.  ``errored`` (and
so ``/health``) turns true as soon as any replica has died, so that an operator
or orchestrator notices.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from minivllm.engine.async_llm import AsyncLLM, EngineDeadError, EngineShutdownError, StatLogger
from minivllm.engine.dp_client import DPClient
from minivllm.engine.input_processor import PromptInput, ValidatedRequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig


class DPAsyncLLM:
    """``data_parallel_size`` engine replicas behind `AsyncLLM`'s interface.

    ``stat_loggers_for(i)``: the stat loggers of replica ``i`` (its metrics carry
    ``engine="i"``)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        stat_loggers_for: Callable[[int], list[StatLogger]] | None = None,
    ) -> None:
        self.client = DPClient(vllm_config)
        self.engines = [
            AsyncLLM(replica, stat_loggers_for(i) if stat_loggers_for else None)  # type: ignore[arg-type]
            for i, replica in enumerate(self.client.replicas)
        ]
        self._where: dict[str, int] = {}
        self._accepting = True

    # -- state ----------------------------------------------------------------
    @property
    def errored(self) -> bool:
        """True once any replica has died (its requests failed; the others go on)."""
        return any(engine.errored for engine in self.engines)

    @property
    def is_accepting(self) -> bool:
        return self._accepting and any(not engine.errored for engine in self.engines)

    def get_tokenizer(self) -> Any:
        return self.client.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        return self.client.model_config

    @property
    def vllm_config(self) -> VllmConfig:
        return self.client.vllm_config

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks of each replica."""
        return self.client.num_blocks

    def process_inputs(
        self,
        prompt: PromptInput,
        params: SamplingParams,
        priority: int = 0,
        lora_request: Any = None,
    ) -> ValidatedRequest:
        # LoRA is refused with internal data parallelism at configuration time, so a
        # request never names an adapter here.
        assert lora_request is None, "LoRA runs without internal data parallelism"
        return self.client.process_inputs(prompt, params, priority)

    def request_counts(self) -> list[int]:
        """Requests routed to each replica so far (the per-engine counters)."""
        return [counts.num_requests for counts in self.client.balancer.counts]

    # -- requests -------------------------------------------------------------
    async def generate(
        self,
        prompt: PromptInput | ValidatedRequest,
        sampling_params: SamplingParams | None,
        request_id: str,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """As `AsyncLLM.generate`, on the replica the balancer picks."""
        if not self._accepting:
            raise EngineShutdownError("the server is shutting down and takes no new requests")
        if not isinstance(prompt, ValidatedRequest):
            prompt = await asyncio.to_thread(
                self.client.process_inputs, prompt, sampling_params, priority
            )
        alive = [not engine.errored for engine in self.engines]
        if not any(alive):
            raise EngineDeadError("every data-parallel engine has died")
        index = self.client.choose(prompt, alive)
        self._where[request_id] = index
        sent = False
        try:
            async for output in self.engines[index].generate(prompt, None, request_id):
                sent = True
                yield output
        finally:
            self._where.pop(request_id, None)
            if not sent and self.engines[index].errored:
                self.client.balancer.unrouted(index)

    async def abort(self, request_id: str) -> None:
        index = self._where.get(request_id)
        if index is not None:
            await self.engines[index].abort(request_id)

    # -- shutdown -------------------------------------------------------------
    def begin_shutdown(self, timeout: float) -> None:
        self._accepting = False
        for engine in self.engines:
            engine.begin_shutdown(timeout)

    def shutdown(self, timeout: float = 0.0) -> None:
        """Drain every replica at once (up to ``timeout`` s), then stop them."""
        self._accepting = False
        threads = [
            threading.Thread(target=engine.shutdown, args=(timeout,)) for engine in self.engines
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.client.shutdown()


__all__ = ["DPAsyncLLM"]
