"""`DPLLMEngine`: `LLMEngine`'s synchronous interface over data-parallel replicas,
for `LLM(..., data_parallel_size=N)`.

`add_request` validates in front and routes (`DPClient`); `step` starts a step on
every replica with work and then gathers them, so the replicas compute at the same
time.  A replica that dies fails the call that was waiting on it
(`ReplicaDiedError`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from minivllm.engine.dp_client import DPClient
from minivllm.engine.input_processor import PromptInput, ValidatedRequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig


class DPLLMEngine:
    """``data_parallel_size`` engine replicas behind the `LLMEngine` methods `LLM` uses."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.client = DPClient(vllm_config)
        self.vllm_config = vllm_config
        self._ids = itertools.count()
        self._where: dict[str, int] = {}

    @property
    def model_config(self) -> ModelConfig:
        return self.client.model_config

    @property
    def replicas(self) -> list[Any]:
        return self.client.replicas

    def get_tokenizer(self) -> Any:
        if self.client.tokenizer is None:
            raise ValueError("this engine was started with skip_tokenizer_init=True")
        return self.client.tokenizer

    def process_inputs(
        self, prompt: PromptInput, params: SamplingParams | None = None, priority: int = 0
    ) -> ValidatedRequest:
        return self.client.process_inputs(prompt, params, priority)

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptInput | ValidatedRequest,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: Any = None,
    ) -> str:
        """Validate, route and queue a request; returns its id."""
        # LoRA is refused with internal data parallelism at configuration time.
        assert lora_request is None, "LoRA runs without internal data parallelism"
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self._where:
                request_id = str(next(self._ids))
        if request_id in self._where:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(prompt, ValidatedRequest):
            prompt = self.process_inputs(prompt, params, priority)
        alive = [r.is_healthy() for r in self.replicas]
        index = self.client.choose(prompt, alive)
        self.replicas[index].add_request(request_id, prompt)
        self._where[request_id] = index
        return request_id

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        outputs: list[RequestOutput] = []
        for index, replica in enumerate(self.replicas):
            mine = [r for r in ids if self._where.get(r) == index]
            if mine and replica.is_healthy():
                outputs += replica.abort_request(mine)
            for r in mine:
                self._where.pop(r, None)
        return outputs

    def step(self) -> list[RequestOutput]:
        """One step of every replica with work, run at the same time."""
        busy = [r for r in self.replicas if r.has_unfinished_requests()]
        for replica in busy:
            replica.submit_step()
        outputs: list[RequestOutput] = []
        for replica in busy:
            outputs += replica.finish_step()
        for output in outputs:
            if output.finished:
                self._where.pop(output.request_id, None)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return any(r.has_unfinished_requests() for r in self.replicas)

    def get_num_unfinished_requests(self) -> int:
        return sum(r.get_stats().num_waiting_reqs + r.get_stats().num_running_reqs
                   for r in self.replicas)  # fmt: skip

    def request_counts(self) -> list[int]:
        """Requests routed to each replica so far."""
        return [counts.num_requests for counts in self.client.balancer.counts]

    def add_stat_loggers(self, stat_loggers: list[Any]) -> None:
        raise ValueError(
            "offline engine statistics (disable_log_stats=False) are not supported by "
            "minivllm yet with data_parallel_size > 1; serve the model to read per-engine "
            "metrics, or leave disable_log_stats at True"
        )

    def is_healthy(self) -> bool:
        return all(r.is_healthy() for r in self.replicas)

    def shutdown(self) -> None:
        self.client.shutdown()


__all__ = ["DPLLMEngine"]
