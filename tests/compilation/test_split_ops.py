"""Which graph nodes a `splitting_ops` entry matches: packets, overloads, vLLM's names."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import fx

from minivllm.compilation.split import is_splitting_node, split_graph
from minivllm.config.compilation import CompilationConfig


def dynamo_graph(fn: Any, *args: torch.Tensor) -> fx.GraphModule:
    """The FX graph Dynamo hands a backend (packets stay packets, with example values)."""
    graphs: list[fx.GraphModule] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return graphs[0]


def adds(x: torch.Tensor) -> torch.Tensor:
    a = torch.ops.aten.add.Tensor(x, x)  # an overload
    b = torch.ops.aten.add.Scalar(a, 2)  # another overload of the same op
    return torch.ops.aten.add(b, b)  # the packet; its arguments select .Tensor


def split_targets(splitting_ops: list[str]) -> list[str]:
    gm = dynamo_graph(adds, torch.ones(3))
    return [str(n.target) for n in gm.graph.nodes if is_splitting_node(n, splitting_ops)]


def test_bare_name_splits_at_every_overload_and_the_packet() -> None:
    assert split_targets(["aten::add"]) == ["aten.add.Tensor", "aten.add.Scalar", "aten.add"]


def test_overload_name_splits_only_at_that_overload() -> None:
    # The packet call counts as the overload its arguments resolve to (Tensor, Tensor).
    assert split_targets(["aten::add.Tensor"]) == ["aten.add.Tensor", "aten.add"]
    assert split_targets(["aten::add.Scalar"]) == ["aten.add.Scalar"]
    assert split_targets(["aten::add.out"]) == []


def test_overload_split_makes_its_own_submodule() -> None:
    gm = dynamo_graph(adds, torch.ones(3))
    _, items = split_graph(gm, ["aten::add.Scalar"])
    assert [item.is_splitting_graph for item in items] == [False, True, False]


@pytest.mark.parametrize(
    ("vllm_name", "minivllm_name"),
    [
        ("vllm::unified_attention", "minivllm::unified_attention_with_output"),
        ("vllm::unified_attention_with_output", "minivllm::unified_attention_with_output"),
        ("vllm::unified_mla_attention_with_output", "minivllm::unified_attention_with_output"),
        ("vllm::unified_kv_cache_update", "minivllm::unified_kv_cache_update"),
        (
            "vllm::unified_attention_with_output.default",
            "minivllm::unified_attention_with_output.default",
        ),
    ],
)
def test_vllm_attention_op_names_mean_minivllms(vllm_name: str, minivllm_name: str) -> None:
    assert CompilationConfig(splitting_ops=[vllm_name]).splitting_ops == [minivllm_name]


def test_vllm_default_attention_ops_count_as_attention() -> None:
    cfg = CompilationConfig(
        splitting_ops=[
            "vllm::unified_attention_with_output",
            "vllm::unified_mla_attention_with_output",
        ]
    )
    assert cfg.splitting_ops == ["minivllm::unified_attention_with_output"]
    assert cfg.splitting_ops_contain_attention()
    overload = CompilationConfig(splitting_ops=["minivllm::unified_attention_with_output.default"])
    assert overload.splitting_ops_contain_attention()


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("vllm::mamba_mixer2", "vLLM op of a layer minivllm's models do not have"),
        ("vllm::sparse_attn_indexer", "remove this entry"),
        ("unified_attention", "is not an op name"),
        ("aten::add.", "is not an op name"),
    ],
)
def test_unmatchable_entries_are_refused(entry: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        CompilationConfig(splitting_ops=[entry])
