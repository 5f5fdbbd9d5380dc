"""Engine arguments: Python keywords, command-line flags, JSON and YAML -> `VllmConfig`.

- `engine_args`: `EngineArgs`, one field per user-settable config field.
- `fields`: the field table (which config fields are engine arguments, their flags).
- `parsing`: value parsers, flag spellings, ``-cc.key=value`` pieces, error messages.
- `parser`: `FlexibleArgumentParser` (vLLM's parser: ``--config file.yaml``, dotted keys).
- `sizes`: human-readable integers (``8k``, ``1M``, ``auto``).

It depends on `minivllm.config` only; the engine and the CLI both use it.  The two
names below load on first use, so ``minivllm --version`` and ``--help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "EngineArgs": "minivllm.args.engine_args",
    "FlexibleArgumentParser": "minivllm.args.parser",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'minivllm.args' has no attribute {name!r}")


__all__ = ["EngineArgs", "FlexibleArgumentParser"]
