"""Graph passes VLLM_COMPILE runs on the traced FX graph before splitting it.

Only ``PassConfig.eliminate_noops`` is implemented: the fusion switches name
CUDA/ROCm kernels minivllm does not have, and the config already turns them off
on platforms that lack them.  A fusion switch that is on anyway is reported once
and ignored rather than silently pretending to run.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from minivllm.compilation.counter import compilation_counter
from minivllm.config.compilation.modes import log_once
from minivllm.config.compilation.pass_config import FUSION_SWITCHES, PassConfig
from minivllm.logger import init_logger

logger = init_logger(__name__)

# Ops that return their input unchanged when the result has the input's shape,
# strides and dtype.  Both the Tensor-method spelling and the torch function are listed.
_VIEW_LIKE_METHODS = frozenset({"view", "reshape", "contiguous", "flatten", "to", "type_as"})
_VIEW_LIKE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.reshape,
        torch.flatten,
        torch.Tensor.view,
        torch.Tensor.reshape,
        torch.Tensor.contiguous,
        torch.ops.aten.view.default,
        torch.ops.aten.reshape.default,
        torch.ops.aten.slice.Tensor,
    }
)


def _example_value(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` provably have one shape, stride, dtype and device."""
    if a.dtype != b.dtype or a.device != b.device or a.dim() != b.dim():
        return False
    pairs = list(zip(a.shape, b.shape, strict=True)) + list(
        zip(a.stride(), b.stride(), strict=True)
    )
    return all(statically_known_true(x == y) for x, y in pairs)


def _is_view_like(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _VIEW_LIKE_METHODS
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        # Only plain slicing (x[a:b], x[:, :n], x[...]) can be a no-op; an int or
        # tensor index changes the rank or copies.
        index = node.args[1]
        items = index if isinstance(index, tuple) else (index,)
        return all(isinstance(i, slice) or i is Ellipsis for i in items)
    return node.target in _VIEW_LIKE_FUNCTIONS


def eliminate_noops(gm: fx.GraphModule) -> int:
    """Replace reshapes, views, slices and casts that leave their input unchanged by the
    input itself; returns how many nodes were removed.

    Such nodes appear wherever model code is written for the general case (a cast to
    float32 of a float32 tensor, a slice over a whole dimension); removing them keeps
    later pattern matching and the split graph small.
    """
    removed = 0
    for node in list(gm.graph.nodes):
        if not _is_view_like(node) or not node.args:
            continue
        src, out = node.args[0], _example_value(node)
        src_val = _example_value(src)
        if not isinstance(out, torch.Tensor) or not isinstance(src_val, torch.Tensor):
            continue
        if not _same_layout(src_val, out):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        removed += 1
    if removed:
        gm.graph.lint()
        gm.recompile()
    compilation_counter.num_noops_eliminated += removed
    return removed


def run_passes(gm: fx.GraphModule, pass_config: PassConfig) -> dict[str, int]:
    """Run the passes ``pass_config`` switches on; returns {pass name: nodes changed}."""
    results: dict[str, int] = {}
    if pass_config.eliminate_noops:
        results["eliminate_noops"] = eliminate_noops(gm)
    # No fusion has a kernel here (see the module docstring).
    for name in FUSION_SWITCHES:
        if getattr(pass_config, name):  # a PassConfig field, named in FUSION_SWITCHES
            log_once(
                logger,
                logging.INFO,
                "pass_config.%s is on, but minivllm has no fused kernel for it (they "
                "serve fp8 quantization); the graph is compiled without this fusion.",
                name,
            )
    return results


__all__ = ["eliminate_noops", "run_passes"]
