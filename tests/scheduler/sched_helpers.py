"""Test doubles for the scheduler: a fake model runner that checks KV bookkeeping."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from minivllm.kv_cache import KVCacheManager
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler import (
    EngineCoreOutput,
    ModelRunnerOutput,
    Request,
    Scheduler,
    SchedulerOptions,
    SchedulerOutput,
)


def _digest(parent: int, token: int) -> int:
    return zlib.crc32(token.to_bytes(8, "little"), parent)


@dataclass
class _ReqState:
    tokens: list[int]
    block_ids: list[int]
    num_computed: int
    # prefix_digest[p] identifies tokens[: p + 1], standing in for the KV at position p.
    prefix_digest: list[int] = field(default_factory=list)

    def extend_digests(self) -> None:
        while len(self.prefix_digest) < len(self.tokens):
            parent = self.prefix_digest[-1] if self.prefix_digest else 0
            self.prefix_digest.append(_digest(parent, self.tokens[len(self.prefix_digest)]))


class FakeModelRunner:
    """Mirrors a worker's per-request state from the scheduler's deltas.

    It "writes" a fingerprint of each computed token's prefix into the KV slot the
    block table gives, and before sampling it "reads" every position back: a wrong
    block table, a bad prefix-cache hit or a reused block would show up as a
    mismatch.  The sampled token is a pure function of the context.
    """

    def __init__(self, block_size: int, vocab_size: int = 1000) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.kv: dict[int, tuple[int, int]] = {}
        self.reqs: dict[str, _ReqState] = {}

    def _slot(self, st: _ReqState, pos: int) -> int:
        return st.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for rid in scheduler_output.finished_req_ids:
            self.reqs.pop(rid, None)
        for new in scheduler_output.scheduled_new_reqs:
            assert new.req_id not in self.reqs, "new request the worker already holds"
            self.reqs[new.req_id] = _ReqState(
                tokens=list(new.prompt_token_ids) + list(new.output_token_ids),
                block_ids=list(new.block_ids),
                num_computed=new.num_computed_tokens,
            )
        cached = scheduler_output.scheduled_cached_reqs
        for rid, blocks, num_computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            st = self.reqs[rid]
            st.block_ids.extend(blocks)
            assert st.num_computed == num_computed, (rid, st.num_computed, num_computed)
        assert scheduler_output.total_num_scheduled_tokens == sum(
            scheduler_output.num_scheduled_tokens.values()
        )

        req_ids, sampled = [], []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            st = self.reqs[rid]
            st.extend_digests()
            assert st.num_computed + n <= len(st.tokens)
            for pos in range(st.num_computed, st.num_computed + n):
                self.kv[self._slot(st, pos)] = (pos, st.prefix_digest[pos])
            st.num_computed += n
            req_ids.append(rid)
            if st.num_computed < len(st.tokens):
                sampled.append([])  # partial prefill: no logits
                continue
            for pos in range(st.num_computed):
                got = self.kv.get(self._slot(st, pos))
                assert got == (pos, st.prefix_digest[pos]), f"{rid}: bad KV at position {pos}"
            token = st.prefix_digest[-1] % self.vocab_size
            st.tokens.append(token)
            sampled.append([token])
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    *,
    enable_caching: bool = True,
    hash_algo: str = "sha256",
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    enable_chunked_prefill: bool = True,
    policy: str = "fcfs",
    long_prefill_token_threshold: int = 0,
    max_concurrent_batches: int = 1,
    send_sampled_tokens: bool = False,
) -> Scheduler:
    manager = KVCacheManager(
        num_blocks, block_size, enable_caching, hash_algo, max_model_len=max_model_len
    )
    return Scheduler(
        manager,
        SchedulerOptions(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            policy=policy,
            long_prefill_token_threshold=long_prefill_token_threshold,
            max_concurrent_batches=max_concurrent_batches,
            send_sampled_tokens=send_sampled_tokens,
        ),
    )


def make_request(
    rid: str,
    prompt: list[int] | int,
    *,
    max_tokens: int | None = 4,
    eos_token_id: int | None = None,
    arrival_time: float = 0.0,
    priority: int = 0,
    **params: object,
) -> Request:
    if isinstance(prompt, int):
        seed = zlib.crc32(rid.encode())
        prompt = [(seed + 7 * i) % 500 + 1 for i in range(prompt)]
    sp = SamplingParams(max_tokens=max_tokens, **params)  # type: ignore[arg-type]
    if eos_token_id is not None:
        sp.update_from_tokenizer(eos_token_id)
    return Request(
        rid, prompt, sp, eos_token_id=eos_token_id, arrival_time=arrival_time, priority=priority
    )


def run_to_completion(
    scheduler: Scheduler, runner: FakeModelRunner, max_steps: int = 10_000
) -> tuple[dict[str, list[int]], dict[str, EngineCoreOutput]]:
    """Drive schedule/execute/update until idle: (tokens per request, final output per request)."""
    tokens: dict[str, list[int]] = {}
    final: dict[str, EngineCoreOutput] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            break
        scheduler_output = scheduler.schedule()
        assert (
            scheduler_output.total_num_scheduled_tokens <= scheduler.options.max_num_batched_tokens
        )
        assert len(scheduler_output.num_scheduled_tokens) <= scheduler.options.max_num_seqs
        for out in scheduler.update_from_output(scheduler_output, runner.execute(scheduler_output)):
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                final[out.request_id] = out
    else:
        raise AssertionError("requests did not finish")
    return tokens, final
