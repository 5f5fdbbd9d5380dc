"""`CompilationConfig.splitting_ops` entries: their form, and vLLM's op names.

An entry is ``"namespace::op"`` (every overload of the op) or
``"namespace::op.overload"`` (that overload only, e.g. ``"aten::add.Tensor"``).

Configs copied from vLLM name vLLM's ops. minivllm's attention layer runs through
two ops of its own, so vLLM's names of the same two steps are translated:

=========================================================  ======================================
vLLM                                                       minivllm
=========================================================  ======================================
``vllm::unified_attention``,                               ``minivllm::unified_attention_with_output``
``vllm::unified_attention_with_output``,
``vllm::unified_mla_attention``,
``vllm::unified_mla_attention_with_output``
``vllm::unified_kv_cache_update``,                         ``minivllm::unified_kv_cache_update``
``vllm::unified_mla_kv_cache_update``
=========================================================  ======================================

(MLA is one more kind of attention layer; its op names the same graph split.) Any
other ``vllm::`` op (Mamba mixers, linear attention, sparse indexers, ...) belongs
to a layer minivllm's models do not have, so it could never match: it is refused.
"""

from __future__ import annotations

import re

from minivllm.config.compilation.cudagraph import ATTENTION_OPS, KV_CACHE_UPDATE_OPS

VLLM_OP_ALIASES: dict[str, str] = {
    **dict.fromkeys(
        (
            "vllm::unified_attention",
            "vllm::unified_attention_with_output",
            "vllm::unified_mla_attention",
            "vllm::unified_mla_attention_with_output",
        ),
        ATTENTION_OPS[0],
    ),
    **dict.fromkeys(
        ("vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update"),
        KV_CACHE_UPDATE_OPS[0],
    ),
}
"""vLLM op name -> the minivllm op that is the same step of an attention layer."""

_ENTRY = re.compile(r"^(?P<op>[A-Za-z_]\w*::[A-Za-z_]\w*)(?:\.(?P<overload>\w+))?$")


def normalize_splitting_ops(ops: list[str]) -> list[str]:
    """Check the form of each entry and translate vLLM's attention op names (see the
    module docstring); duplicates after translation are dropped, order is kept."""
    out: list[str] = []
    for entry in ops:
        match = _ENTRY.match(entry.strip()) if isinstance(entry, str) else None
        if match is None:
            raise ValueError(
                f"splitting_ops entry {entry!r} is not an op name; use 'namespace::op' for "
                "every overload or 'namespace::op.overload' for one, e.g. 'aten::add' or "
                "'aten::add.Tensor'."
            )
        op, overload = match["op"], match["overload"]
        if op.startswith("vllm::"):
            if op not in VLLM_OP_ALIASES:
                known = ", ".join(sorted(VLLM_OP_ALIASES))
                raise ValueError(
                    f"splitting_ops entry {entry!r} is a vLLM op of a layer minivllm's models "
                    f"do not have, so it would never split the graph. minivllm translates "
                    f"only vLLM's attention ops ({known}) to its own "
                    f"({ATTENTION_OPS[0]}, {KV_CACHE_UPDATE_OPS[0]}); remove this entry."
                )
            op = VLLM_OP_ALIASES[op]
        name = f"{op}.{overload}" if overload else op
        if name not in out:
            out.append(name)
    return out


def names_op(ops: list[str] | None, op: str) -> bool:
    """Whether ``ops`` splits at every call of the single-overload op ``op`` (by its
    name or its ``.default`` overload)."""
    return ops is not None and (op in ops or f"{op}.default" in ops)


__all__ = ["VLLM_OP_ALIASES", "names_op", "normalize_splitting_ops"]
