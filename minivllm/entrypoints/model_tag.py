"""The optional positional MODEL of ``minivllm serve`` and ``minivllm config``.

It is a shorthand for ``--model``: when given, it wins over ``--model`` and counts as
set by the user.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minivllm.args.engine_args import EngineArgs


def add_model_tag_argument(parser: argparse.ArgumentParser) -> None:
    """Register the optional positional ``MODEL`` (stored as ``args.model_tag``)."""
    parser.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="Model name or path (default: the bundled SmolLM2-135M-Instruct GGUF).",
    )


def engine_args_from_cli(args: argparse.Namespace) -> EngineArgs:
    """`EngineArgs` from the parsed engine flags, with ``MODEL`` applied when given."""
    # Imported here so that building the CLI parser for --help stays light.
    from minivllm.args.engine_args import EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    model_tag = getattr(args, "model_tag", None)
    if model_tag is not None:
        engine_args.set_user_arg("model", model_tag)
    return engine_args
