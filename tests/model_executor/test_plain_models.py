"""The models stay plain: no execution-mode branch in a model file, no per-step
state in a module global, and the CPU decode graph's changes (inlined attention,
fused layers, piece boundaries) applied to a copy of the model from outside."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pkgutil
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig

import minivllm
from minivllm.attention.decode_graph import DecodeAttention
from minivllm.attention.layer import Attention, bind_kv_caches, get_attention_layers
from minivllm.model_executor.decode_view import LAYERS_PER_PIECE, LayerBoundary, decode_view
from minivllm.model_executor.models.llama import LlamaForCausalLM

PACKAGES = ("minivllm.attention", "minivllm.model_executor")
MODELS_DIR = Path(minivllm.__file__).parent / "model_executor" / "models"
# How a model file would name the decode graph or CPU layer fusion ("refuses" is fine).
EXECUTION_MODE = re.compile(
    r"decode_graph|decode_view|DECODE_INPUTS|fused_decoder_layer|decode_layer_boundary"
    r"|\bfus(e|ed|es|ing|ion|able)\b|is_compiling",
    re.IGNORECASE,
)


def _step_state(value: Any) -> bool:
    """Whether a module global could carry one step's state: a tensor, a mutable
    object of minivllm's own, or a container holding either."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (dict, list, set)):
        items = list(value.values()) if isinstance(value, dict) else list(value)
        return any(_step_state(v) for v in items)
    cls = type(value)
    if not cls.__module__.startswith("minivllm") or isinstance(value, (type, enum.Enum)):
        return False
    params = getattr(cls, "__dataclass_params__", None)
    return not (params is not None and params.frozen)


def _mutable_globals(module: types.ModuleType) -> list[str]:
    return [
        f"{module.__name__}.{name}"
        for name, value in vars(module).items()
        if not name.startswith("__") and _step_state(value)
    ]


def test_no_module_global_holds_step_state() -> None:
    modules = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            modules.append(importlib.import_module(info.name))
    assert len(modules) > 20
    found = [g for m in modules for g in _mutable_globals(m)]
    assert found == [], f"per-step state belongs in the forward context: {found}"


def test_the_check_catches_a_step_state_holder() -> None:
    """A module-level holder like the old ``DECODE_INPUTS`` is what the scan finds."""

    @dataclasses.dataclass
    class Inputs:
        seq_lens: torch.Tensor | None = None

    Inputs.__module__ = "minivllm.attention.example"
    fake = types.ModuleType("minivllm.attention.example")
    fake.INPUTS = Inputs()  # type: ignore[attr-defined]
    fake.TABLES = {"seq_lens": torch.zeros(1)}  # type: ignore[attr-defined]
    fake.LIMIT = 64  # type: ignore[attr-defined]
    assert _mutable_globals(fake) == [
        "minivllm.attention.example.INPUTS",
        "minivllm.attention.example.TABLES",
    ]


def test_model_files_do_not_know_how_they_are_run() -> None:
    files = sorted(MODELS_DIR.glob("*.py"))
    assert {"llama.py", "gemma3.py"} <= {f.name for f in files}
    hits = [
        f"{f.name}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if EXECUTION_MODE.search(line)
    ]
    assert hits == []
    assert EXECUTION_MODE.search("if DECODE_INPUTS.tracing:")  # the pattern bites
    assert not EXECUTION_MODE.search("the loader refuses models without this flag")


@pytest.fixture(scope="module")
def tiny_model() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=LAYERS_PER_PIECE + 1, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    layers = get_attention_layers(model)
    bind_kv_caches(layers, [torch.zeros(2, 8, 4, 2, 16) for _ in layers])
    return model


def test_decode_view_changes_a_copy_and_shares_the_weights(tiny_model: LlamaForCausalLM) -> None:
    model = tiny_model
    before = [(name, type(m)) for name, m in model.named_modules()]
    view, num_fused = decode_view(model, torch.float32, native_attention=False)
    assert num_fused == 0  # float32 weights: nothing for the fused C++ layer
    # The model is untouched: same modules, no decode-graph stand-ins.
    assert [(name, type(m)) for name, m in model.named_modules()] == before
    assert not any(isinstance(m, (DecodeAttention, LayerBoundary)) for m in model.modules())
    # The copy inlines every attention layer and marks a boundary after each piece.
    copied = view.model
    decode_attn = [m for m in copied.modules() if isinstance(m, DecodeAttention)]
    originals = list(get_attention_layers(model).values())
    assert [d.layer for d in decode_attn] == originals  # the model's layers, caches bound
    assert all(
        not isinstance(m, Attention) or any(m is d.layer for d in decode_attn)
        for m in copied.modules()
    )
    marks = [i for i, la in enumerate(copied.model.layers) if isinstance(la, LayerBoundary)]
    assert marks == [LAYERS_PER_PIECE - 1]
    # Weights are shared, not copied.
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in view.parameters()} == ptrs
    assert copied.model.embed_tokens is not model.model.embed_tokens
    assert copied.model.embed_tokens.weight is model.model.embed_tokens.weight
    # The rotary table shared by all layers stays one module in the copy.
    rotaries = {id(la.self_attn.rotary_emb) for la in copied.model.layers[: LAYERS_PER_PIECE - 1]}
    assert len(rotaries) == 1
