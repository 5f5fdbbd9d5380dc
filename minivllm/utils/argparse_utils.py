"""Argument parsing helpers under vLLM's module path (``vllm.utils.argparse_utils``)."""

from __future__ import annotations

from minivllm.engine.arg_sizes import human_readable_int, human_readable_int_or_auto
from minivllm.engine.cli_parser import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser", "human_readable_int", "human_readable_int_or_auto"]
