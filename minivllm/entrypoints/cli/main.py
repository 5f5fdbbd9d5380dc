"""The ``minivllm`` command: ``minivllm COMMAND [flags]``.

Subcommands are registered by name and module path and imported only when
chosen, so ``minivllm config`` never loads the engine or the model code.  A
subcommand module provides ``add_arguments(parser)`` and ``run(args) -> int``;
adding one is one line in `SUBCOMMANDS`.  A `ValueError` escaping a subcommand
(a bad flag value, a config that cannot be resolved) becomes one line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from minivllm import __version__
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.parsing import reduce_error
from minivllm.entrypoints.cli.grouped_help import add_grouped_help

SUBCOMMANDS: list[tuple[str, str, str]] = [
    (
        "config",
        "minivllm.entrypoints.cli.config",
        "Print the resolved engine configuration (--explain: where each value came from).",
    ),
    (
        "generate",
        "minivllm.entrypoints.cli.generate",
        "Complete prompts (--stream: token by token).",
    ),
    (
        "chat",
        "minivllm.entrypoints.cli.chat",
        "Chat with the model, reading user turns from stdin.",
    ),
    (
        "serve",
        "minivllm.entrypoints.cli.serve",
        "Serve a model over an OpenAI-compatible HTTP API.",
    ),
    (
        "disagg-proxy",
        "minivllm.entrypoints.cli.disagg_proxy",
        "Disaggregated prefill: each request to a prefill instance, then a decode one.",
    ),
    ("bench", "minivllm.entrypoints.bench.cli", "Benchmark throughput, latency, serving, start-up"),
]
"""(name, module, one-line help) of every subcommand; modules are imported lazily."""
GROUPED_HELP_COMMANDS = frozenset({"serve", "generate", "chat"})
"""Commands with hundreds of engine flags: their --help comes in groups (grouped_help)."""


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first non-flag token)."""
    for token in argv:
        if not token.startswith("-"):
            return token
        if token == "--":
            return None
    return None


def build_parser(argv: Sequence[str]) -> FlexibleArgumentParser:
    """The top-level parser, with full flags only for the subcommand in ``argv``."""
    parser = FlexibleArgumentParser(
        prog="minivllm", description="minivllm: a small LLM inference and serving engine."
    )
    parser.add_argument("-v", "--version", action="version", version=f"minivllm {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=FlexibleArgumentParser
    )
    chosen = _chosen_command(argv)
    for name, module_name, summary in SUBCOMMANDS:
        paged = name in GROUPED_HELP_COMMANDS
        sub = subparsers.add_parser(name, help=summary, description=summary, add_help=not paged)
        if paged:
            add_grouped_help(sub)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(_run=module.run, _parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minivllm`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the subcommand's parser, which can suggest its own flags
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args) or 0)
    except ValueError as exc:  # pydantic's ValidationError included
        args._parser.error(reduce_error(exc, None))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
