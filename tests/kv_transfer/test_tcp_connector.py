"""TcpConnector: one engine prefills (``kv_producer``), another pulls the KV over TCP
and decodes (``kv_consumer``), driven by ``kv_transfer_params`` as vLLM's proxy does.

- The consumer's greedy output is the producer's own (one instance), and it computes
  one prompt token per request; the response of the prefill carries the parameters.
- A producer that is gone, or that dies in the middle of a transfer, fails that
  request alone with a clear error; its blocks are freed and the rest runs.
"""

from __future__ import annotations

import socket
import threading

import pytest
from kv_helpers import GREEDY, make_llm, prompts
from server_utils import free_port

from minivllm import LLM, SamplingParams


def _config(role: str, port: int, **extra) -> dict:  # noqa: ANN003
    return {"kv_connector": "TcpConnector", "kv_role": role, "kv_port": port,
            "kv_connector_extra_config": {"transfer_timeout_s": 5, **extra}}  # fmt: skip


def _params(kv_transfer_params: dict, **kwargs) -> SamplingParams:  # noqa: ANN003
    base = dict(temperature=0.0, max_tokens=GREEDY.max_tokens, ignore_eos=True)
    base.update(kwargs)
    return SamplingParams(**base, extra_args={"kv_transfer_params": kv_transfer_params})


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def producer(tiny_model: str, port: int) -> LLM:
    return make_llm(tiny_model, _config("kv_producer", port))


@pytest.fixture(scope="module")
def consumer(tiny_model: str) -> LLM:
    return make_llm(tiny_model, _config("kv_consumer", free_port()))


def _prefill(producer: LLM, items) -> list[dict]:  # noqa: ANN001
    outs = producer.generate(
        items, _params({"do_remote_decode": True}, max_tokens=1), use_tqdm=False
    )
    return [o.kv_transfer_params for o in outs]


def _decode(consumer: LLM, items, params):  # noqa: ANN001, ANN202
    engine = consumer.llm_engine
    for i, (item, p) in enumerate(zip(items, params, strict=True)):
        engine.add_request(f"d{i}-{id(item)}", item, _params(p))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[k] for k in sorted(done, key=lambda k: int(k[1 : k.index("-")]))]


def test_consumer_decodes_what_one_instance_generates(producer: LLM, consumer: LLM, port) -> None:  # noqa: ANN001
    items = prompts(3, 37, seed=5)
    expected = [
        list(o.outputs[0].token_ids) for o in producer.generate(items, GREEDY, use_tqdm=False)
    ]
    params = _prefill(producer, items)
    assert all(p["do_remote_prefill"] and p["remote_port"] == port for p in params)
    assert all(p["remote_num_tokens"] == 36 for p in params)
    before = consumer.llm_engine.get_stats().prompt_token_stats
    outs = _decode(consumer, items, params)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    after = consumer.llm_engine.get_stats()
    assert after.prompt_token_stats.local_compute - before.local_compute == 3  # one token each
    assert after.prompt_token_stats.external_kv_transfer - before.external_kv_transfer == 3 * 36
    assert after.kv_connector_stats.num_loaded_blocks == 3 * 5
    assert consumer.llm_engine.scheduler.kv_cache_manager.get_num_held_blocks() == 0


def test_unreachable_producer_fails_those_requests_alone(consumer: LLM) -> None:
    items = prompts(2, 30, seed=6)
    dead = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": free_port(),
            "remote_request_id": "gone", "remote_num_tokens": 29}  # fmt: skip
    outs = _decode(consumer, items, [dead, {}])
    assert outs[0].outputs[0].finish_reason == "error"
    assert "KV transfer from the prefill instance" in outs[0].error
    assert "is it running?" in outs[0].error
    assert outs[1].outputs[0].finish_reason == "length" and outs[1].error is None
    manager = consumer.llm_engine.scheduler.kv_cache_manager
    assert manager.get_num_held_blocks() == 0 and manager.usage == 0.0


def test_producer_dying_mid_transfer_fails_the_request(consumer: LLM) -> None:
    """A fake producer sends the status and half the blocks, then dies."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            size = int.from_bytes(conn.recv(4), "big")
            conn.recv(size)
            status = b'{"ok": true}'
            conn.sendall(len(status).to_bytes(4, "big") + status)
            conn.sendall((10_000).to_bytes(8, "big") + b"MVKVBLK1" + b"\0" * 100)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    params = {"do_remote_prefill": True, "remote_host": "127.0.0.1",
              "remote_port": server.getsockname()[1], "remote_request_id": "r",
              "remote_num_tokens": 29}  # fmt: skip
    (out,) = _decode(consumer, prompts(1, 30, seed=7), [params])
    assert out.outputs[0].finish_reason == "error"
    assert "connection closed after" in out.error
    assert consumer.llm_engine.scheduler.kv_cache_manager.get_num_held_blocks() == 0


def test_recompute_policy_computes_the_prompt_instead(tiny_model: str, producer: LLM) -> None:
    kv = _config("kv_consumer", free_port())
    kv["kv_load_failure_policy"] = "recompute"
    llm = make_llm(tiny_model, kv)
    items = prompts(1, 30, seed=8)
    expected = [
        list(o.outputs[0].token_ids) for o in producer.generate(items, GREEDY, use_tqdm=False)
    ]
    dead = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": free_port(),
            "remote_request_id": "gone", "remote_num_tokens": 29}  # fmt: skip
    (out,) = _decode(llm, items, [dead])
    assert out.error is None and [list(out.outputs[0].token_ids)] == expected


def test_loading_does_not_stall_the_batch_and_abort_frees_the_blocks(consumer: LLM) -> None:
    """While one request waits for a producer that does not answer, another runs to
    the end; aborting the waiting one frees its blocks once its load gives up."""
    from minivllm.scheduler.request import RequestStatus

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    release = threading.Event()

    def hold() -> None:
        conn, _ = server.accept()
        release.wait(20)
        conn.close()
        server.close()

    threading.Thread(target=hold, daemon=True).start()
    engine = consumer.llm_engine
    waiting = {"do_remote_prefill": True, "remote_host": "127.0.0.1",
               "remote_port": server.getsockname()[1], "remote_request_id": "slow",
               "remote_num_tokens": 29}  # fmt: skip
    slow, quick = prompts(2, 30, seed=9)
    engine.add_request("slow", slow, _params(waiting))
    engine.add_request("quick", quick, _params({}))
    finished = set()
    while "quick" not in finished:
        finished |= {o.request_id for o in engine.step() if o.finished}
    request = engine.scheduler.requests["slow"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert engine.scheduler.kv_cache_manager.get_num_held_blocks("slow") > 0
    engine.abort_request("slow")
    release.set()
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv_cache_manager.get_num_held_blocks() == 0


def test_a_taken_port_is_refused_and_shutdown_frees_it(tiny_model: str, producer, port) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}.*kv_port"):
        make_llm(tiny_model, _config("kv_producer", port))
    other_port = free_port()
    other = make_llm(tiny_model, _config("kv_producer", other_port))
    other.llm_engine.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", other_port))  # free again
