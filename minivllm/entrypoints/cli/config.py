"""``minivllm config [MODEL] [engine flags]``: print the resolved `VllmConfig`.

Without ``--explain`` it prints the whole resolved configuration as JSON
(enums by name).  With ``--explain`` it prints, for every field, its value
and where the value came from -- the user, the optimization level, the
platform, a named resolution rule (with its reason) or the class default --
as a table, or as JSON with ``--format json``.  ``--platform cuda:9.0``
resolves as that platform would, on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
from contextlib import nullcontext
from pathlib import PurePath
from typing import Any, TextIO

from minivllm.entrypoints.model_tag import add_model_tag_argument, engine_args_from_cli

_VALUE_WIDTH = 48
"""Longest value shown in a table cell (the JSON formats are never shortened)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags, the optional MODEL, and the output options."""
    from minivllm.args.engine_args import EngineArgs

    add_model_tag_argument(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--explain",
        action="store_true",
        help="Show, for every field, whether the user, the optimization level, the platform, "
        "a resolution rule or the default set it, and why.",
    )
    out.add_argument(
        "--format",
        choices=["json", "table"],
        default=None,
        help="Output format (default: table with --explain, json without).",
    )
    out.add_argument(
        "--platform",
        metavar="SPEC",
        default=None,
        help="Resolve as this platform would: 'cpu', 'cuda' or 'cuda:MAJOR.MINOR' "
        "(e.g. cuda:9.0, cuda:10.0). Default: the platform of this machine.",
    )
    EngineArgs.add_cli_args(parser)


def to_jsonable(value: Any) -> Any:
    """A JSON-ready copy of a config tree: enums by name, sets sorted, objects by str."""
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name, None))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_") and f.metadata.get("explain") is not False
        }
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    return str(value)  # torch.dtype and other objects with a readable str()


def _cell(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    if len(text) > _VALUE_WIDTH:
        count = f" ({len(value)} items)" if isinstance(value, (list, dict)) else ""
        keep = _VALUE_WIDTH - len(count) - 3
        text = text[:keep] + "..." + count
    return text


def format_table(rows: list[list[str]], out: TextIO) -> None:
    """Left-aligned columns; the last column is never padded or cut."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


def explain_rows(explained: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Table rows (path, value, source, reason) for ``VllmConfig.explain()``."""
    rows = [["PATH", "VALUE", "SOURCE", "REASON"]]
    for path, entry in explained.items():
        source = entry["source"]
        if entry.get("rule"):
            source = f"{source}:{entry['rule']}"
        rows.append([path, _cell(entry["value"]), source, entry.get("reason", "")])
    return rows


def run(args: argparse.Namespace) -> int:
    """Resolve the configuration and print it; ValueErrors go to the CLI's one-line error."""
    from minivllm.platforms import override_platform, parse_platform

    engine_args = engine_args_from_cli(args)
    try:
        platform = parse_platform(args.platform) if args.platform else None
    except ValueError as exc:
        raise ValueError(f"argument --platform: {exc}") from None
    with override_platform(platform) if platform is not None else nullcontext():
        vllm_config = engine_args.create_engine_config()
        explained = vllm_config.explain() if args.explain else None

    fmt = args.format or ("table" if args.explain else "json")
    out = sys.stdout
    if explained is not None:
        if fmt == "json":
            json.dump(to_jsonable(explained), out, indent=2)
            out.write("\n")
        else:
            format_table(explain_rows(to_jsonable(explained)), out)
        return 0
    tree = to_jsonable(vllm_config)
    if fmt == "json":
        json.dump(tree, out, indent=2)
        out.write("\n")
    else:
        from minivllm.config.provenance import flatten

        rows = [["PATH", "VALUE"]] + [[p, _cell(v)] for p, v in flatten(vllm_config).items()]
        format_table(rows, out)
    return 0
