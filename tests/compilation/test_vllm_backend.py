"""VLLM_COMPILE: graph splitting, per-size and per-range pieces, the eliminate_noops pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from compile_helpers import NUM_LAYERS, save_tiny_llama

from minivllm.args.engine_args import EngineArgs
from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.layer import get_attention_layers
from minivllm.compilation.backend import VllmBackend
from minivllm.compilation.counter import compilation_counter
from minivllm.compilation.passes import eliminate_noops
from minivllm.compilation.wrapper import build_model_forward
from minivllm.config.vllm import set_current_vllm_config
from minivllm.model_executor.loader import load_model

ATTN = "minivllm::unified_attention_with_output"
KV_UPDATE = "minivllm::unified_kv_cache_update"


def build(model_dir: Path, **compilation: Any) -> tuple[Any, Any, dict[str, Any]]:
    cfg = EngineArgs(
        model=str(model_dir),
        dtype="float32",
        skip_tokenizer_init=True,
        compilation_config={"mode": "VLLM_COMPILE", "backend": "eager", **compilation},
    ).create_engine_config()
    with set_current_vllm_config(cfg):
        model = load_model(str(model_dir), cfg.model_config.hf_config, torch.float32)
    return model, build_model_forward(model, cfg), get_attention_layers(model)


@torch.inference_mode()
def run(forward: Any, model: Any, layers: dict[str, Any], n: int) -> None:
    ids = torch.randint(0, 128, (n,))
    pos = torch.arange(n)
    with set_forward_context(None, layers):
        torch.testing.assert_close(forward(ids, pos), model(ids, pos))


def test_one_piece_more_than_splitting_ops(tiny_llama: Path) -> None:
    model, forward, layers = build(tiny_llama, splitting_ops=[ATTN])
    run(forward, model, layers, 8)
    backend: VllmBackend = forward.backend
    split_ops = [i for i in backend.items if i.is_splitting_graph]
    assert len(split_ops) == NUM_LAYERS  # one attention op per layer
    assert len(backend.pieces) == len(split_ops) + 1


def test_identical_decoder_pieces_are_compiled_once(tmp_path: Path) -> None:
    """Pieces that differ only in which layer's weights they take share one compile."""
    model, forward, layers = build(save_tiny_llama(tmp_path, num_layers=4))
    before = compilation_counter.clone()
    run(forward, model, layers, 8)
    backend: VllmBackend = forward.backend
    assert len(backend.pieces) == 5
    compiled = [id(fn) for p in backend.pieces for _, fn in p.range_entries]
    # first (embedding + layer 0), three identical middles, last (final norm)
    assert len(set(compiled)) == 3 * len(backend.compilation_config.get_compile_ranges())
    middle = [[id(fn) for _, fn in p.range_entries] for p in backend.pieces[1:4]]
    assert middle[0] == middle[1] == middle[2]
    assert compilation_counter.delta(before)["num_backend_compilations"] == len(set(compiled))


def test_default_splitting_ops_isolate_kv_update_and_attention(tiny_llama: Path) -> None:
    model, forward, layers = build(tiny_llama)
    run(forward, model, layers, 8)
    backend: VllmBackend = forward.backend
    assert backend.compilation_config.splitting_ops == [ATTN, KV_UPDATE]
    split_ops = [i for i in backend.items if i.is_splitting_graph]
    assert len(split_ops) == 2 * NUM_LAYERS
    for item in split_ops:
        ops = [n for n in item.graph.graph.nodes if n.op == "call_function"]
        assert len(ops) == 1  # each splitting op sits alone
    # The update and the attention of a layer are adjacent: no piece between them.
    assert len(backend.pieces) == NUM_LAYERS + 1


def test_compile_size_gets_its_own_piece_and_wins_over_range(tiny_llama: Path) -> None:
    model, forward, layers = build(tiny_llama, compile_sizes=[4], compile_ranges_endpoints=[8])
    before = compilation_counter.clone()
    run(forward, model, layers, 8)
    backend: VllmBackend = forward.backend
    ranges = backend.compilation_config.get_compile_ranges()
    assert [(r.start, r.end) for r in ranges] == [(1, 8), (9, 2048)]
    piece = backend.pieces[0]
    assert piece.size_entries == {4: None}  # compiled on first use
    run(forward, model, layers, 4)
    run(forward, model, layers, 12)
    sized = piece.size_entries[4]
    assert sized is not None
    by_range = dict(piece.range_entries)
    small, large = by_range[ranges[0]], by_range[ranges[1]]
    assert piece.runtime_size(_fake_args(piece, 4)) == 4
    assert piece.entry_for(_fake_args(piece, 4)) is sized
    assert piece.entry_for(_fake_args(piece, 5)) is small
    assert piece.entry_for(_fake_args(piece, 9)) is large
    # Three distinct pieces x (two ranges + one size); eager compiles are cheap.
    num_distinct = len({id(f) for p in backend.pieces for f in p.size_entries.values()})
    assert compilation_counter.delta(before)["num_backend_compilations"] == 3 * num_distinct


def _fake_args(piece: Any, n: int) -> tuple[Any, ...]:
    args: list[Any] = [None] * (piece.token_arg + 1)
    args[piece.token_arg] = n if piece.token_dim is None else torch.empty(n)
    return tuple(args)


def _dynamo_graph(fn: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return graphs[0]


def test_eliminate_noops_removes_only_noops() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x.reshape(x.shape[0], x.shape[1])  # no-op
        b = a[:, :]  # no-op
        c = b.to(torch.float32)  # no-op
        d = c.view(-1)  # real reshape
        e = y[:, :2]  # real slice
        return d.sum() + e.sum() + c.contiguous()[0, 0]  # contiguous() is a no-op too

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    gm = _dynamo_graph(f, x, y)
    expected = gm(x, y)
    assert eliminate_noops(gm) == 4
    torch.testing.assert_close(gm(x, y), expected)
    methods = [n.target for n in gm.graph.nodes if n.op == "call_method"]
    assert "view" in methods and "reshape" not in methods and "to" not in methods


def test_eliminate_noops_runs_on_the_model_and_can_be_turned_off(tiny_llama: Path) -> None:
    model, forward, layers = build(tiny_llama, custom_ops=["none"])
    before = compilation_counter.clone()
    run(forward, model, layers, 8)
    assert compilation_counter.delta(before).get("num_noops_eliminated", 0) > 0
    model, forward, layers = build(tiny_llama, pass_config={"eliminate_noops": False})
    before = compilation_counter.clone()
    run(forward, model, layers, 8)
    assert compilation_counter.delta(before).get("num_noops_eliminated", 0) == 0


@pytest.mark.parametrize("dynamic", ["backed", "unbacked"])
def test_dynamic_shapes_type_is_honoured(tiny_llama: Path, dynamic: str) -> None:
    model, forward, layers = build(tiny_llama, dynamic_shapes_config={"type": dynamic})
    for n in (8, 1, 5):
        run(forward, model, layers, n)
    assert forward.num_traces == 1


@pytest.mark.parametrize("attention_op", ["vllm::unified_attention_with_output", f"{ATTN}.default"])
def test_attention_split_by_vllm_name_or_overload(tiny_llama: Path, attention_op: str) -> None:
    model, forward, layers = build(tiny_llama, splitting_ops=[attention_op])
    run(forward, model, layers, 8)
    backend: VllmBackend = forward.backend
    assert len([i for i in backend.items if i.is_splitting_graph]) == NUM_LAYERS
