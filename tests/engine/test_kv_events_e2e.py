"""KV cache events end to end: an engine publishing on ZeroMQ, a subscriber on loopback.

A tiny random Gemma 3 (one sliding-window layer, one whole-context layer: two KV
cache groups) with a 40-block KV pool serves prompts that overflow it (so cached
blocks get evicted), then its prefix cache is reset.  The subscriber decodes
every batch with its own structs written from vLLM's schema (`kv_event_schema`);
the events replayed into a set equal the block pool's cached hashes; the replay
socket returns the batches from any sequence number, byte for byte what was
published, then vLLM's end marker.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from kv_event_schema import DECODER, AllBlocksCleared, BlockRemoved, apply, pool_state
from server_utils import free_port

from minivllm import LLM, SamplingParams
from minivllm.config.kv_events import KVEventsConfig
from minivllm.distributed.kv_events import (
    EventPublisherFactory,
    NullEventPublisher,
    ZmqEventPublisher,
)

PUB_PORT, REPLAY_PORT = free_port(), free_port()
TOPIC = b"kv@minivllm"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    from model_helpers import save_random_hf_model

    path = tmp_path_factory.mktemp("tiny-gemma3")
    save_random_hf_model(
        path,
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        head_dim=16,
        sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
    )
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{PUB_PORT}",
        "replay_endpoint": f"tcp://*:{REPLAY_PORT}",
        "topic": TOPIC.decode(),
    }
    engine = LLM(
        model=str(path),
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=0,
        block_size=16,
        num_gpu_blocks_override=40,
        kv_events_config=events,
    )
    yield engine
    engine.llm_engine.shutdown()


def _receive_until_cleared(sub: zmq.Socket) -> list[tuple[int, bytes]]:
    """Live ``(seq, payload)`` messages up to the batch holding `AllBlocksCleared`."""
    got = []
    while sub.poll(10_000):
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC and len(seq) == 8
        got.append((int.from_bytes(seq, "big"), payload))
        if any(isinstance(e, AllBlocksCleared) for e in DECODER.decode(payload).events):
            return got
    raise AssertionError(f"no AllBlocksCleared after {len(got)} batches")


def _replay(ctx: zmq.Context, start: int) -> list[tuple[int, bytes]]:
    """Ask the replay socket for the batches from ``start`` (a DEALER speaks to ROUTER)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{REPLAY_PORT}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    try:
        while dealer.poll(10_000):
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), payload))
        raise AssertionError("the replay did not end with END_SEQ")
    finally:
        dealer.close(linger=0)


def _prompts(seed: int, n: int, length: int, prefix: list[int] | None = None) -> list[Any]:
    rng = random.Random(seed)
    head = prefix or []
    return [
        {"prompt_token_ids": head + [rng.randrange(1, 128) for _ in range(length - len(head))]}
        for _ in range(n)
    ]


def test_subscriber_mirrors_the_pool_and_replays_missed_batches(llm: LLM) -> None:
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(f"tcp://127.0.0.1:{PUB_PORT}")
    try:
        assert sub.poll(300) == 0  # nothing published before any request
        shared = _prompts(1, 1, 40)[0]["prompt_token_ids"]
        llm.generate(_prompts(2, 3, 70, shared), GREEDY, use_tqdm=False)
        llm.generate(_prompts(3, 4, 75), GREEDY, use_tqdm=False)  # overflows the pool
        llm.generate(_prompts(4, 2, 60, shared), GREEDY, use_tqdm=False)
        pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
        before_reset = pool_state(pool.cached_block_hash_to_block)
        assert {group for group, _ in before_reset} == {0, 1}  # both KV cache groups
        assert llm.reset_prefix_cache()
        live = _receive_until_cleared(sub)
    finally:
        sub.close(linger=0)
    # The replay has every batch since seq 0; live ones are the same bytes.
    everything = _replay(ctx, 0)
    last = everything[-1][0]
    assert [seq for seq, _ in everything] == list(range(last + 1))
    assert set(live) <= set(everything) and live[-1][0] == last
    batches = [DECODER.decode(payload) for _, payload in everything]
    assert all(b.data_parallel_rank == 0 and b.ts > 0 for b in batches)
    assert any(isinstance(e, BlockRemoved) for b in batches for e in b.events)
    mirror: set = set()
    for batch in batches[:-1]:
        apply(mirror, batch)
    assert mirror == before_reset
    apply(mirror, batches[-1])
    assert mirror == set() == pool_state(pool.cached_block_hash_to_block)
    # A malformed request is ignored; the socket goes on serving.
    bad = ctx.socket(zmq.DEALER)
    bad.connect(f"tcp://127.0.0.1:{REPLAY_PORT}")
    bad.send_multipart([b"", b"\x01"])
    assert bad.poll(300) == 0
    bad.close(linger=0)
    # A subscriber that missed batches asks from the first one it lacks.
    assert _replay(ctx, last - 2) == everything[-3:]
    assert _replay(ctx, last + 1) == []


def test_null_publisher_sends_nothing_and_binds_nothing() -> None:
    spare = free_port()
    quiet = KVEventsConfig(enable_kv_cache_events=True, publisher="null",
                           endpoint=f"tcp://*:{spare}")  # fmt: skip
    off = KVEventsConfig(publisher="zmq", endpoint=f"tcp://*:{spare}")
    for config in (quiet, off, None):
        publisher = EventPublisherFactory.create(config)
        assert isinstance(publisher, NullEventPublisher)
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.bind(f"tcp://127.0.0.1:{spare}")  # free: no publisher took it
    try:
        # A zmq publisher cannot have an address in use: a clear error, no traceback.
        busy = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{spare}")
        with pytest.raises(ValueError, match=r"kv_events_config.endpoint=.*cannot be used"):
            EventPublisherFactory.create(busy)
    finally:
        sock.close(linger=0)
    # zmq releases a closed socket's port in its I/O thread, some time later: a free
    # address of its own shows the publisher binding when nothing is in the way.
    publisher = EventPublisherFactory.create(
        KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{free_port()}")
    )
    assert isinstance(publisher, ZmqEventPublisher)
    publisher.shutdown()


def test_batches_go_out_in_order_and_shutdown_flushes_them() -> None:
    from minivllm.kv_cache.events import AllBlocksCleared as Cleared
    from minivllm.kv_cache.events import KVEventBatch

    ctx = zmq.Context.instance()
    publisher = ZmqEventPublisher(data_parallel_rank=3, endpoint="inproc://kv-order", topic="t")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"t")
    sub.connect("inproc://kv-order")
    try:
        publisher.publish(KVEventBatch(ts=0.5, events=[Cleared()]))  # joins before the sub
        time.sleep(0.2)
        for i in range(1, 50):
            publisher.publish(KVEventBatch(ts=float(i), events=[Cleared()]))
        publisher.shutdown()  # sends what is queued before closing
        got = []
        while sub.poll(1000):
            _, seq, payload = sub.recv_multipart()
            got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    finally:
        sub.close(linger=0)
    assert [seq for seq, _ in got][-49:] == list(range(1, 50))
    assert all(b.ts == seq and b.data_parallel_rank == 3 for seq, b in got[-49:])
    with pytest.raises(RuntimeError, match="shut down"):
        publisher.publish(KVEventBatch(ts=1.0, events=[]))
