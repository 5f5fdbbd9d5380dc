"""Cost of KV cache events in the block pool's bookkeeping, and what goes over the wire.

Drives the real `KVCacheManager` through a stream of requests (each a prefill of a
prompt sharing a prefix with others, then decode steps), with a pool small enough
that cached blocks keep being evicted, once with events off and once on (the log,
plus draining and msgpack-encoding each step's batch as the engine's publisher
does).  Prints the time per request both ways, the events and the bytes per step.
Torch-free: bookkeeping only, no model runs.

    python benchmarks/kv_events.py
    python benchmarks/kv_events.py --requests 2000 --prompt 1024 --blocks 512
"""

from __future__ import annotations

import argparse
import random
import time

import msgspec

from minivllm.kv_cache import KVCacheManager
from minivllm.kv_cache.events import KVEventBatch
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request


def run(args: argparse.Namespace, events: bool) -> tuple[float, int, int, int]:
    """(seconds, steps, events, encoded bytes) for the whole stream."""
    mgr = KVCacheManager(args.blocks, args.block_size, enable_kv_cache_events=events)
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(0)
    prefixes = [[rng.randrange(50_000) for _ in range(args.prompt // 2)] for _ in range(8)]
    steps = num_events = num_bytes = 0

    def drain() -> None:
        nonlocal steps, num_events, num_bytes
        steps += 1
        batch = mgr.take_events()
        if batch:  # as the engine: a step without events sends nothing
            num_events += len(batch)
            num_bytes += len(encoder.encode(KVEventBatch(ts=time.time(), events=batch)))

    start = time.perf_counter()
    for i in range(args.requests):
        tail = [rng.randrange(50_000) for _ in range(args.prompt - args.prompt // 2)]
        prompt = rng.choice(prefixes) + tail
        req = Request(str(i), prompt, SamplingParams(), block_hasher=mgr.block_hasher)
        hits, num_hit = mgr.get_computed_blocks(req)
        assert mgr.allocate_slots(req, req.num_tokens - num_hit, hits) is not None
        req.num_computed_tokens = req.num_tokens
        mgr.cache_blocks(req, req.num_tokens)
        drain()
        for t in range(args.decode):
            req.append_output_token_ids(t)
            assert mgr.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
            mgr.cache_blocks(req, req.num_computed_tokens)
            drain()
        mgr.free(req)
    return time.perf_counter() - start, steps, num_events, num_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--decode", type=int, default=32, help="decode steps per request")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=256, help="KV pool size")
    args = parser.parse_args()
    # Best of three each, alternating, so a busy machine disturbs both alike.
    runs = [(run(args, events=False), run(args, events=True)) for _ in range(3)]
    off, steps, _, _ = min(r[0] for r in runs)
    on, _, num_events, num_bytes = min(r[1] for r in runs)
    per_req = 1e6 / args.requests
    print(f"{args.requests} requests, {steps} steps, pool {args.blocks} x {args.block_size}")
    print(f"events off: {off * per_req:8.1f} us/request")
    print(f"events on : {on * per_req:8.1f} us/request (+{(on - off) * 1e6 / steps:.2f} us/step)")
    print(f"{num_events / steps:.2f} events/step, {num_bytes / steps:.0f} bytes/step encoded")
    print(f"({num_events} events in all, {num_bytes / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
