"""Registering minivllm's torch custom ops with little per-call overhead.

``torch.library.custom_op`` wraps every call in Python checks (aliasing of the
outputs, a Dynamo-disabled frame), which costs several microseconds per call --
noticeable for ops a decode step runs hundreds of times.  `register_op` defines
the schema from the function's annotations and registers the function itself as
the kernel of one dispatch key, plus a fake (meta) implementation for tracing, so
a call goes from the dispatcher straight into the function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.library import Library, infer_schema

_LIBRARY = Library("minivllm", "FRAGMENT")
"""The ``minivllm`` op namespace (``torch.ops.minivllm.<name>``)."""


def register_op(
    name: str,
    impl: Callable[..., Any],
    fake: Callable[..., Any],
    mutates_args: Iterable[str] = (),
    dispatch_key: str = "CompositeExplicitAutograd",
) -> Any:
    """Define ``minivllm::<name>`` with ``impl`` as its kernel; returns the op packet.

    ``mutates_args`` names the arguments the op writes to (as in
    ``torch.library.custom_op``); ``fake`` computes output shapes for tracing.
    The default dispatch key serves every device; ops are inference-only.
    """
    schema = infer_schema(impl, mutates_args=tuple(mutates_args))
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, impl, dispatch_key)
    torch.library.register_fake(f"minivllm::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.minivllm, name)


def eager_or_op(op: Any, impl: Callable[..., Any]) -> Callable[..., Any]:
    """A function that runs ``impl`` itself in eager mode (no dispatcher round trip)
    and calls the op packet ``op`` while Dynamo traces, so the graph keeps it opaque."""

    def call(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return op(*args)
        return impl(*args)

    call.__doc__ = impl.__doc__
    return call


__all__ = ["eager_or_op", "register_op"]
