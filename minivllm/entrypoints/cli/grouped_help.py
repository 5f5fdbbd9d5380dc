"""``--help`` in pages, as in vLLM: the flags a command is about first, the engine flags
by group.

``minivllm serve|generate|chat|bench <name> --help`` prints the command's own flags (sampling,
server) and a list of the engine flag groups; ``--help=all`` prints every flag,
``--help=<Group>`` (``--help=CacheConfig``, case-insensitive) one group, and any
other ``--help=WORD`` the flags whose name or help mentions WORD.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

ENGINE_GROUP_SUFFIX = "Config"
"""Engine flag groups are titled by their config class (ModelConfig, CacheConfig, ...)."""


def is_engine_group(group: argparse._ArgumentGroup) -> bool:
    return bool(group.title and group.title.endswith(ENGINE_GROUP_SUFFIX))


def collapsed_group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """A group of the command's own flags that the short ``--help`` lists by name and
    count, as it lists the engine groups (``--help=<title>`` shows its flags)."""
    group = parser.add_argument_group(title)
    group.collapsed = True  # type: ignore[attr-defined]
    return group


def _is_collapsed(group: argparse._ArgumentGroup) -> bool:
    return is_engine_group(group) or getattr(group, "collapsed", False)


def _visible(actions: list[argparse.Action]) -> list[argparse.Action]:
    return [a for a in actions if a.help != argparse.SUPPRESS]


def _format(
    parser: argparse.ArgumentParser,
    sections: list[tuple[str | None, str | None, list[argparse.Action]]],
    epilog: str | None = None,
) -> str:
    formatter = parser._get_formatter()
    formatter.add_usage(f"{parser.prog} [options]  (--help=all: every flag)", None, None)
    formatter.add_text(parser.description)
    for title, description, actions in sections:
        formatter.start_section(title)
        formatter.add_text(description)
        formatter.add_arguments(actions)
        formatter.end_section()
    formatter.add_text(epilog)
    return formatter.format_help()


def grouped_help(parser: argparse.ArgumentParser, topic: str | None) -> str:
    """The help text for ``--help`` (``topic`` None), ``--help=all``, a group or a word."""
    if topic is not None and topic.lower() == "all":
        return parser.format_help()
    groups = [g for g in parser._action_groups if _visible(g._group_actions)]
    engine = [g for g in groups if _is_collapsed(g)]
    if topic is None:
        own = [g for g in groups if not _is_collapsed(g)]
        # The command's own groups, sampling first, then the rest in their order.
        own.sort(key=lambda g: g.title != "sampling")
        sections = [(g.title, g.description, _visible(g._group_actions)) for g in own]
        lines = ["more flags, by group (show one with --help=<group>, all with --help=all):"]
        width = max((len(g.title or "") for g in engine), default=0)
        for g in engine:
            count = len(_visible(g._group_actions))
            lines.append(f"  {(g.title or '').ljust(width)}  {count} flags")
        epilog = "\n".join(lines) if engine else None
        return _format(parser, sections, None) + ("\n" + epilog + "\n" if epilog else "")
    wanted = topic.lower()
    for g in groups:
        if (g.title or "").lower() == wanted:
            return _format(parser, [(g.title, g.description, _visible(g._group_actions))])
    matches = [
        a
        for g in groups
        for a in _visible(g._group_actions)
        if any(wanted in s.lower() for s in a.option_strings) or wanted in (a.help or "").lower()
    ]
    if matches:
        return _format(parser, [(f"flags matching {topic!r}", None, matches)])
    titles = ", ".join(g.title or "" for g in groups)
    parser.error(f"--help={topic}: no such group or flag; groups: {titles}, or all")


class GroupedHelpAction(argparse.Action):
    """``-h`` / ``--help[=TOPIC]``: print `grouped_help` and exit 0."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # fmt: skip
        super().__init__(option_strings, dest, nargs="?", const=None, default=default,
                         metavar="GROUP", help=help)  # fmt: skip

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> NoReturn:
        print(grouped_help(parser, values), end="")
        parser.exit()


def add_grouped_help(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` (made with ``add_help=False``) the grouped ``-h/--help``."""
    parser.add_argument(
        "-h",
        "--help",
        action=GroupedHelpAction,
        help="Show the command's own flags and the engine flag groups; --help=all: every "
        "flag; --help=<group>: one group (e.g. --help=CacheConfig); --help=WORD: flags "
        "that mention WORD.",
    )
