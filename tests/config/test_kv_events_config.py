"""`KVEventsConfig`: vLLM's fields and defaults, the ``--kv-events-config`` flag, and the
values it refuses (each with the reason and the fix)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from minivllm.args.engine_args import EngineArgs, FlexibleArgumentParser
from minivllm.config import KVEventsConfig
from minivllm.config.utils import field_docs

VLLM_DEFAULTS = {
    "enable_kv_cache_events": False,
    "publisher": "null",
    "endpoint": "tcp://*:5557",
    "replay_endpoint": None,
    "buffer_steps": 10_000,
    "hwm": 100_000,
    "max_queue_size": 100_000,
    "topic": "",
}


def test_fields_and_defaults_are_vllms() -> None:
    cfg = KVEventsConfig()
    assert {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)} == VLLM_DEFAULTS
    docs = field_docs(KVEventsConfig)
    assert all(docs.get(name) for name in VLLM_DEFAULTS)


def test_publisher_follows_enable_unless_set() -> None:
    assert KVEventsConfig(enable_kv_cache_events=True).publisher == "zmq"
    assert KVEventsConfig(enable_kv_cache_events=True, publisher="null").publisher == "null"
    assert KVEventsConfig(publisher="zmq").publisher == "zmq"


def test_flag_reaches_the_engine_config() -> None:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    flag = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:18620", "topic": "kv"}'
    args = parser.parse_args(["--kv-events-config", flag])
    cfg = EngineArgs.from_cli_args(args).create_engine_config()
    events = cfg.kv_events_config
    assert events is not None
    assert (events.publisher, events.endpoint, events.topic) == ("zmq", "tcp://*:18620", "kv")
    assert EngineArgs().create_engine_config().kv_events_config is None


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"publisher": "kafka"}, "publisher"),
        ({"endpoint": "localhost:5557"}, "not a ZeroMQ endpoint"),
        ({"endpoint": "tcp://*"}, "not a ZeroMQ endpoint"),
        ({"replay_endpoint": "http://x:1"}, "replay_endpoint.*not a ZeroMQ endpoint"),
        ({"replay_endpoint": "tcp://*:5557"}, "its own address"),
        ({"buffer_steps": 0}, "buffer_steps must be >= 1"),
        ({"max_queue_size": 0}, "max_queue_size must be >= 1"),
        ({"hwm": -1}, "hwm must be >= 0"),
        ({"unknown_knob": 1}, "unknown_knob"),
    ],
)
def test_bad_values_are_refused_with_the_reason(settings: dict, words: str) -> None:
    args = EngineArgs(kv_events_config={"enable_kv_cache_events": True, **settings})
    with pytest.raises(ValueError, match=words) as err:
        args.create_engine_config()
    assert "kv-events-config" in str(err.value) or "kv_events_config" in str(err.value)


def test_inert_settings_warn_as_vllm_does(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        EngineArgs(
            kv_events_config={"enable_kv_cache_events": True}, enable_prefix_caching=False
        ).create_engine_config()
        EngineArgs(kv_events_config={"publisher": "zmq"}).create_engine_config()
    text = caplog.text
    assert "prefix caching is not enabled" in text
    assert "KV cache events are disabled" in text
