"""``minivllm bench throughput|latency|serve|startup [flags]``.

Each benchmark's flags are added only when it is the one chosen on the command
line, so ``bench serve`` (a pure HTTP client) never imports torch for the engine
flags the offline benchmarks need.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

from minivllm.args.parser import FlexibleArgumentParser
from minivllm.entrypoints.cli.grouped_help import add_grouped_help, is_engine_group

BENCHMARKS: list[tuple[str, str, str]] = [
    (
        "throughput",
        "minivllm.entrypoints.bench.throughput",
        "Offline throughput on a dataset: requests/s, input and output tokens/s.",
    ),
    (
        "latency",
        "minivllm.entrypoints.bench.latency",
        "End-to-end latency of one batch: average and percentiles.",
    ),
    (
        "serve",
        "minivllm.entrypoints.bench.serve",
        "Load-test an OpenAI-compatible server: TTFT, TPOT, ITL, E2EL, throughput, goodput.",
    ),
    (
        "startup",
        "minivllm.entrypoints.bench.startup",
        "Cold and warm (cached) start-up time to the first token.",
    ),
]
"""(name, module, one-line help) of each benchmark; a module has add_cli_args and main."""


class _LazySubParsersAction(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Fills in a benchmark's flags just before its sub-parser parses the rest."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list) and values, "argparse passes the chosen name first"
        chosen = self._name_parser_map.get(values[0])
        module_name = getattr(chosen, "_bench_module", None)
        if chosen is not None and module_name is not None:
            module = importlib.import_module(module_name)
            module.add_cli_args(chosen)
            _show_defaults(chosen)
            chosen.set_defaults(_bench_main=module.main, _parser=chosen)
            chosen._bench_module = None  # type: ignore[attr-defined]
        super().__call__(parser, namespace, values, option_string)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per benchmark."""
    subparsers = parser.add_subparsers(
        dest="bench_command",
        metavar="BENCHMARK",
        required=True,
        action=_LazySubParsersAction,
        parser_class=FlexibleArgumentParser,
    )
    for name, module_name, summary in BENCHMARKS:
        # Most benchmarks take every engine flag: --help shows the benchmark's own flags
        # and the engine flag groups, as `serve --help` does.
        sub = subparsers.add_parser(name, help=summary, description=summary, add_help=False)
        add_grouped_help(sub)
        sub._bench_module = module_name  # type: ignore[attr-defined]


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to the help of the benchmark's own flags that have a
    default and do not state it (engine flags document their own)."""
    for group in parser._action_groups:
        if is_engine_group(group):
            continue
        for action in group._group_actions:
            text = action.help or ""
            if text == argparse.SUPPRESS or "default" in text.lower():
                continue
            # nargs 0: a switch, off unless given.
            if action.default is None or action.default == argparse.SUPPRESS or action.nargs == 0:
                continue
            text = text.rstrip()
            end = "." if text.endswith(".") else ""
            action.help = f"{text.removesuffix('.')} (default: %(default)s){end}".lstrip()


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark (its figures are printed and written by the benchmark)."""
    args._bench_main(args)
    return 0
