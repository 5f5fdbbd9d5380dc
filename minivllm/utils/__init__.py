"""Utilities importable where vLLM users look for them.

``from minivllm.utils import FlexibleArgumentParser`` (vLLM's older spelling) and
``from minivllm.utils.argparse_utils import FlexibleArgumentParser`` (its current one)
both work; the parser itself lives in `minivllm.args.parser`.
"""

from __future__ import annotations

from minivllm.utils.argparse_utils import (
    FlexibleArgumentParser,
    human_readable_int,
    human_readable_int_or_auto,
)

__all__ = ["FlexibleArgumentParser", "human_readable_int", "human_readable_int_or_auto"]
