"""Argument parsing helpers under vLLM's module path (``vllm.utils.argparse_utils``)."""

from __future__ import annotations

from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.sizes import human_readable_int, human_readable_int_or_auto

__all__ = ["FlexibleArgumentParser", "human_readable_int", "human_readable_int_or_auto"]
