"""Turns the scheduler's per-step token updates into `RequestOutput`s.

For each request it keeps an incremental detokenizer (which also finds stop
strings), the logprobs so far, and, for ``n > 1``, the parent that gathers the
children's completions into one output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.pooling import make_pooling_output
from minivllm.outputs import (
    CompletionOutput,
    Logprob,
    PoolingRequestOutput,
    RequestOutput,
    make_logprobs_dict,
)
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.scheduler.output import EngineCoreOutput
from minivllm.stats import RequestSpecDecodeStats

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig


@dataclass
class ParentRequest:
    """The user's request when it fans out into ``n`` children."""

    request_id: str
    n: int
    prompt: str | None
    prompt_token_ids: list[int]
    output_kind: RequestOutputKind
    completions: dict[int, CompletionOutput] = field(default_factory=dict)
    num_finished: int = 0
    prompt_logprobs: list[Any] | None = None
    prompt_logprobs_source: str | None = None
    """The child whose prompt logprobs are kept (children compute the same ones)."""
    num_cached_tokens: int = 0
    error: str | None = None
    """Set when a child failed (finish_reason "error"); the whole request fails."""
    kv_transfer_params: dict[str, Any] | None = None
    """The KV connector's parameters for the response (disaggregated prefill)."""


@dataclass
class RequestState:
    """Output-side state of one (child) request."""

    request_id: str
    parent: ParentRequest
    index: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    sent_tokens: int = 0
    arrival_time: float = field(default_factory=time.time)
    first_token_time: float | None = None
    spec_decode: RequestSpecDecodeStats | None = None
    pooling_params: PoolingParams | None = None
    """Set for a pooling request (its output is a `PoolingRequestOutput`)."""


class OutputProcessor:
    """Owns the `RequestState` of every live request."""

    def __init__(
        self,
        tokenizer: Any | None,
        spec_decode_metrics: str = "none",
        model_config: ModelConfig | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_config = model_config
        """Needed for pooling requests (their pooler's settings)."""
        # per_request_spec_decode_metrics: "none", "summary" or "detailed".
        self.spec_decode_metrics = spec_decode_metrics
        self.states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}

    def add_request(
        self,
        parent: ParentRequest,
        child_id: str,
        index: int,
        params: SamplingParams,
        pooling_params: PoolingParams | None = None,
    ) -> None:
        detok = None
        if self.tokenizer is not None and params.detokenize:
            detok = IncrementalDetokenizer(
                self.tokenizer,
                parent.prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
                stop=params.stop or (),
                include_stop_str_in_output=params.include_stop_str_in_output,
                min_tokens=params.min_tokens,
            )
        self.parents[parent.request_id] = parent
        self.states[child_id] = RequestState(
            request_id=child_id,
            parent=parent,
            index=index,
            params=params,
            detokenizer=detok,
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
            pooling_params=pooling_params,
        )

    def has_request(self, child_id: str) -> bool:
        return child_id in self.states

    def child_ids_of(self, request_id: str) -> list[str]:
        return [cid for cid, s in self.states.items() if s.parent.request_id == request_id]

    def _decode(self, token_id: int) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([token_id])

    def _spec_metrics(self, state: RequestState) -> dict[str, Any] | None:
        if self.spec_decode_metrics == "none":
            return None
        stats = state.spec_decode or RequestSpecDecodeStats()
        return stats.summary(detailed=self.spec_decode_metrics == "detailed")

    def process_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput | PoolingRequestOutput], list[str]]:
        """Apply one step's updates; returns the outputs to deliver and the ids of
        requests that a stop string finished (the caller must abort them)."""
        results: dict[str, RequestOutput] = {}
        pooled: list[PoolingRequestOutput] = []
        stopped: list[str] = []
        for eco in outputs:
            state = self.states.get(eco.request_id)
            if state is None:
                continue
            if eco.pooling_output is not None:
                pooled.append(self._pooling_output(state, eco))
                continue
            finish_reason, stop_reason = eco.finish_reason, eco.stop_reason
            if eco.error is not None:
                state.parent.error = eco.error
            if eco.new_token_ids and state.first_token_time is None:
                state.first_token_time = time.time()
            state.output_token_ids.extend(eco.new_token_ids)
            if eco.spec_decode is not None:
                state.spec_decode = eco.spec_decode
            self._add_logprobs(state, eco)
            self._add_prompt_logprobs(state.parent, eco)
            if eco.num_cached_tokens:
                state.parent.num_cached_tokens = eco.num_cached_tokens
            if eco.kv_transfer_params is not None:
                state.parent.kv_transfer_params = eco.kv_transfer_params
            if state.detokenizer is not None and eco.new_token_ids:
                stop_terminated = finish_reason == "stop" and not isinstance(stop_reason, str)
                matched = state.detokenizer.update(eco.new_token_ids, stop_terminated)
                if matched is not None and finish_reason is None:
                    finish_reason, stop_reason = "stop", matched
                    stopped.append(eco.request_id)
            output = self._make_output(state, finish_reason, stop_reason)
            if output is None:
                continue
            earlier = results.get(output.request_id)
            if earlier is not None and state.parent.output_kind == RequestOutputKind.DELTA:
                # Two children of one request moved this step: a delta output carries only
                # its own child, so merge them rather than drop the first child's delta.
                earlier.outputs.extend(output.outputs)
                earlier.finished = output.finished
            else:
                # Cumulative outputs hold every child, so the latest one supersedes.
                results[output.request_id] = output
        return [*results.values(), *pooled], stopped

    def _pooling_output(self, state: RequestState, eco: EngineCoreOutput) -> PoolingRequestOutput:
        """A pooling request's only output; the request is done."""
        assert state.pooling_params is not None and self.model_config is not None
        del self.states[state.request_id]
        parent = self.parents.pop(state.parent.request_id)
        return make_pooling_output(
            parent.request_id,
            eco.pooling_output,
            state.pooling_params,
            self.model_config,
            parent.prompt_token_ids,
            eco.num_cached_tokens,
        )

    def _add_logprobs(self, state: RequestState, eco: EngineCoreOutput) -> None:
        if state.logprobs is None or not eco.new_logprobs:
            return
        num = state.params.logprobs
        for entry in eco.new_logprobs:
            if entry is None:
                continue
            token_id, logprob, rank, top = entry
            state.logprobs.append(
                make_logprobs_dict(
                    token_id, logprob, rank, list(top), list(top.values()), num, self._decode
                )
            )
            assert state.cumulative_logprob is not None
            state.cumulative_logprob += logprob

    def _add_prompt_logprobs(self, parent: ParentRequest, eco: EngineCoreOutput) -> None:
        if not eco.new_prompt_logprobs:
            return
        # Every child of an n > 1 request computes the same prompt logprobs; keep one's.
        if parent.prompt_logprobs_source is None:
            parent.prompt_logprobs_source = eco.request_id
        elif parent.prompt_logprobs_source != eco.request_id:
            return
        entries = eco.new_prompt_logprobs
        if parent.prompt_logprobs is None or entries[0] is None:
            # A chunk that starts at prompt position 0 (whose entry is None) starts over:
            # a request preempted part-way through its prefill recomputes it from scratch.
            parent.prompt_logprobs = []
        for entry in entries:
            if len(parent.prompt_logprobs) >= len(parent.prompt_token_ids):
                break
            if entry is None:
                parent.prompt_logprobs.append(None)
                continue
            token_id, logprob, rank, top = entry
            parent.prompt_logprobs.append(
                make_logprobs_dict(
                    token_id, logprob, rank, list(top), list(top.values()), -1, self._decode
                )
            )

    def _make_output(
        self, state: RequestState, finish_reason: str | None, stop_reason: int | str | None
    ) -> RequestOutput | None:
        parent = state.parent
        finished = finish_reason is not None
        delta = parent.output_kind == RequestOutputKind.DELTA
        if finished:
            del self.states[state.request_id]
            parent.num_finished += 1
        text = ""
        if state.detokenizer is not None:
            text = state.detokenizer.get_next_output_text(finished, delta)
        start = state.sent_tokens if delta else 0
        token_ids = state.output_token_ids[start:]
        logprobs = state.logprobs[start:] if state.logprobs is not None else None
        state.sent_tokens = len(state.output_token_ids)
        parent.completions[state.index] = CompletionOutput(
            index=state.index,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=state.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            spec_decode_metrics=self._spec_metrics(state),
        )
        all_done = parent.num_finished == parent.n
        if all_done:
            self.parents.pop(parent.request_id, None)
        if parent.output_kind == RequestOutputKind.FINAL_ONLY and not all_done:
            return None
        if delta:
            outputs = [parent.completions.pop(state.index)]
        else:
            outputs = [parent.completions[i] for i in sorted(parent.completions)]
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            prompt_logprobs=parent.prompt_logprobs,
            outputs=outputs,
            finished=all_done,
            num_cached_tokens=parent.num_cached_tokens,
            error=parent.error,
            kv_transfer_params=parent.kv_transfer_params,
        )

    def remove_request(self, request_id: str) -> None:
        """Forget a request and all its children without producing an output."""
        self.parents.pop(request_id, None)
        for child_id in self.child_ids_of(request_id):
            del self.states[child_id]

    def abort_requests(self, child_ids: list[str]) -> list[RequestOutput]:
        """Finish ``child_ids`` with reason "abort"; returns their final outputs."""
        results = []
        for cid in child_ids:
            state = self.states.get(cid)
            if state is not None:
                out = self._make_output(state, "abort", None)
                if out is not None:
                    results.append(out)
        return results
