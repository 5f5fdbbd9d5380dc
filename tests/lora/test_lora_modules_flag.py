"""``--lora-modules``: vLLM's two forms, and a clear error for a malformed entry."""

from __future__ import annotations

import argparse

import pytest

from minivllm.entrypoints.cli.main import build_parser
from minivllm.entrypoints.lora_modules import LoRAModulePath, parse_lora_module


def test_name_equals_path_and_the_json_form() -> None:
    assert parse_lora_module("sql=/a/sql") == LoRAModulePath("sql", "/a/sql")
    entry = '{"name": "chat", "path": "/a/chat", "base_model_name": "base"}'
    assert parse_lora_module(entry) == LoRAModulePath("chat", "/a/chat", "base")


@pytest.mark.parametrize("value", ["sql", "=/a", '{"name": "x"}', "{not json"])
def test_a_malformed_entry_says_what_is_expected(value) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--lora-modules"):
        parse_lora_module(value)


def test_serve_takes_several_modules() -> None:
    argv = ["serve", "--enable-lora", "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}']
    args = build_parser(argv).parse_args(argv)
    assert [m.name for m in args.lora_modules] == ["a", "b"]
    assert args.enable_lora
