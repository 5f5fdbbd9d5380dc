"""Splitting the traced FX graph at the splitting ops (attention, KV-cache update).

Each splitting op becomes a submodule of its own that runs eagerly (it reads the
per-step attention metadata and cannot be captured in a piecewise CUDA graph);
the runs of ordinary nodes between them become the pieces that get compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx
from torch.fx.passes.split_module import split_module


@dataclasses.dataclass
class SplitItem:
    """One submodule of the split graph."""

    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    graph: fx.GraphModule


def op_name(target: Any) -> str | None:
    """``"namespace::name"`` of a torch op target, or None for anything else."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket._qualified_op_name
    return None


def called_overload(node: fx.Node) -> str | None:
    """The overload name ``node`` runs (``"default"``, ``"Tensor"``), or None if unknown.

    Dynamo graphs call packets (``torch.ops.minivllm.unified_attention_with_output``);
    a packet with one overload runs that one, otherwise the overload is the one the
    argument types select, resolved from the traced example values."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._overloadname
    if not isinstance(target, torch._ops.OpOverloadPacket):
        return None
    overloads = target.overloads()
    if len(overloads) == 1:
        return overloads[0]

    def example(arg: fx.Node) -> Any:
        return arg.meta.get("example_value", arg.meta.get("val"))

    args = fx.node.map_arg(node.args, example)
    kwargs = fx.node.map_arg(node.kwargs, example)
    try:
        return torch._C._jit_resolve_packet(target._qualified_op_name, *args, **kwargs)
    except Exception:  # no example values or no matching schema: unknown
        return None


def is_splitting_node(node: fx.Node, splitting_ops: list[str]) -> bool:
    """Whether ``node`` calls one of ``splitting_ops``: ``"ns::op"`` names every overload
    of the op, ``"ns::op.overload"`` that overload only (``aten::add.default``)."""
    if node.op != "call_function":
        return False
    name = op_name(node.target)
    if name is None:
        return False
    if name in splitting_ops:
        return True
    if not any(op.startswith(name + ".") for op in splitting_ops):
        return False
    overload = called_overload(node)
    return overload is not None and f"{name}.{overload}" in splitting_ops


def split_graph(
    gm: fx.GraphModule, splitting_ops: list[str]
) -> tuple[fx.GraphModule, list[SplitItem]]:
    """Split ``gm`` so every splitting-op call sits alone in its own submodule.

    Returns the split module (calling ``submod_0``, ``submod_1``, ... in order) and
    one `SplitItem` per submodule, in execution order.
    """
    subgraph_id = 0
    node_to_subgraph: dict[fx.Node, int] = {}
    splitting_ids: set[int] = set()
    for node in gm.graph.nodes:
        if node.op in ("output", "placeholder"):
            continue
        if is_splitting_node(node, splitting_ops):
            subgraph_id += 1
            node_to_subgraph[node] = subgraph_id
            splitting_ids.add(subgraph_id)
            subgraph_id += 1
        else:
            node_to_subgraph[node] = subgraph_id
    split_gm = split_module(gm, None, lambda node: node_to_subgraph[node], keep_original_order=True)
    items: list[SplitItem] = []
    names = [name for (name, _) in split_gm.named_children()]
    for name in names:
        if "." in name or not name.startswith("submod_"):
            continue  # nested modules of a piece, not pieces
        graph_id = int(name.removeprefix("submod_"))
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, getattr(split_gm, name)))
    items.sort(key=lambda item: item.graph_id)
    return split_gm, items


__all__ = ["SplitItem", "called_overload", "is_splitting_node", "op_name", "split_graph"]
