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
        sub = subparsers.add_parser(name, help=summary, description=summary)
        sub._bench_module = module_name  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark (its figures are printed and written by the benchmark)."""
    args._bench_main(args)
    return 0
