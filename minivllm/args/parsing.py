"""Generic machinery behind `EngineArgs`: config fields -> argparse arguments.

Nothing here knows a particular config class: flags are derived from the
dataclass fields of whatever classes `EngineArgs` maps (their annotations give
the argparse type and choices, their field docstrings the help).  The flag
spellings on top of argparse live in `minivllm.args.parser`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import enum
import json
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from minivllm.args.sizes import (
    HUMAN_READABLE_HELP,
    SUFFIXED,
    human_readable_int,
    human_readable_int_or_auto,
)

EXPLICIT_ATTR = "_explicit_args"
"""Namespace attribute holding the dests of flags the user actually gave."""
PIECES_ATTR = "_json_pieces"
"""Namespace attribute holding, per config-valued flag, the merged keys the user gave
(the flag's value itself is the config built from them)."""


# --------------------------------------------------------------------------
# Field introspection
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConfigField:
    """One init field of a config class, with its resolved annotation and default."""

    name: str
    """Field name on the config class."""
    annotation: Any
    """Resolved type (pydantic resolves forward references for us)."""
    default: Any
    """Default value, or ``dataclasses.MISSING`` when a factory builds it."""
    default_factory: Callable[[], Any] | None
    """Zero-argument factory for mutable defaults."""

    def make_default(self) -> Any:
        """A fresh default value (factories are called each time)."""
        if self.default_factory is not None:
            return self.default_factory()
        return None if self.default is dataclasses.MISSING else copy.copy(self.default)


def config_fields(cls: type) -> list[ConfigField]:
    """The user-settable (init, public) fields of the dataclass ``cls``."""
    from pydantic_core import PydanticUndefined

    pyd = getattr(cls, "__pydantic_fields__", {})
    hints: dict[str, Any] = {}
    if not pyd:
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # unresolved forward refs: fall back to raw annotations
            hints = {}
    out: list[ConfigField] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        info = pyd.get(f.name)
        if info is not None:
            default = info.default
            factory = info.default_factory
            if default is PydanticUndefined:
                default = dataclasses.MISSING
            out.append(ConfigField(f.name, info.annotation, default, factory))  # type: ignore[arg-type]
            continue
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        out.append(ConfigField(f.name, hints.get(f.name, f.type), f.default, factory))
    return out


def strip_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None -> (X, True)``; also unwraps ``Annotated[X, ...]``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            inner, _ = strip_optional(args[0])
            return inner, optional
        return typing.Union[tuple(args)], optional  # noqa: UP007 - built at run time
    return annotation, False


def is_config_class(tp: Any) -> bool:
    """True for a dataclass type (a nested config such as CompilationConfig)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


# --------------------------------------------------------------------------
# Value parsers (argparse `type=` callables with helpful errors)
# --------------------------------------------------------------------------
def parse_json_or_str(text: str) -> Any:
    """JSON when ``text`` parses as JSON, then a size such as ``8k`` (as vLLM's dotted
    flags do), else the string itself (``-cc.mode=VLLM_COMPILE``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if SUFFIXED.fullmatch(text.strip()):
        try:
            return human_readable_int(text)
        except argparse.ArgumentTypeError:
            pass
    return text


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object such as ``'{"mode": 3}'``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON {text!r} ({exc.msg}); pass an object such as "
            "'{\"mode\": 3}' or use the dotted form -cc.KEY=VALUE"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object, got {text!r}; pass e.g. '{{\"mode\": 3}}'"
        )
    return value


def enum_choices_text(enum_cls: type[enum.Enum]) -> str:
    """How the valid values of an enum are shown to users."""
    if issubclass(enum_cls, int):
        return ", ".join(f"{m.value} ({m.name})" for m in enum_cls)
    return ", ".join(m.name for m in enum_cls)


def enum_parser(enum_cls: type[enum.Enum]) -> Callable[[str], enum.Enum]:
    """Parse an enum member by name (any case) or by value (``3`` or ``O3``)."""

    def parse(text: str) -> enum.Enum:
        key = text.strip()
        for member in enum_cls:
            if member.name.lower() == key.lower() or str(member.value).lower() == key.lower():
                return member
        raise argparse.ArgumentTypeError(
            f"invalid choice {text!r} (choose from {enum_choices_text(enum_cls)})"
        )

    parse.__name__ = enum_cls.__name__
    return parse


def bool_parser(text: str) -> bool:
    """``true/false/1/0/yes/no`` for booleans inside lists and config files."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


_SCALARS: dict[Any, Callable[[str], Any]] = {int: int, float: float, str: str, Path: str}


def _scalar_parser(tp: Any) -> Callable[[str], Any] | None:
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp is bool:
        return bool_parser
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return enum_parser(tp)
    if typing.get_origin(tp) is Literal:
        return _literal_type(typing.get_args(tp))
    return None


def _literal_type(values: tuple[Any, ...]) -> Callable[[str], Any]:
    kinds = {type(v) for v in values}
    return int if kinds == {int} else (float if kinds <= {int, float} else str)


# --------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------
_TRACKED: dict[type, type] = {}


def tracked_action(action_cls: type[argparse.Action]) -> type[argparse.Action]:
    """A subclass of ``action_cls`` that records its dest as explicitly given."""
    if action_cls not in _TRACKED:

        class Tracked(action_cls):  # type: ignore[valid-type, misc]
            def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
                super().__call__(parser, namespace, values, option_string)
                explicit = set(getattr(namespace, EXPLICIT_ATTR, ()))
                explicit.add(self.dest)
                setattr(namespace, EXPLICIT_ATTR, explicit)

        Tracked.__name__ = f"Tracked{action_cls.__name__}"
        _TRACKED[action_cls] = Tracked
    return _TRACKED[action_cls]


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` merged over ``base`` (nested dicts merge, other values replace)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def check_keys(cls: type, data: dict[str, Any], flag: str, prefix: str = "") -> None:
    """Reject keys that are not init fields of ``cls`` (recursing into nested configs)."""
    fields = {f.name: f for f in config_fields(cls)}
    # InitVars (legacy spellings such as `level`) are accepted by the constructor too.
    initvars = {
        name
        for name, f in getattr(cls, "__dataclass_fields__", {}).items()
        if f._field_type is dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
    }
    for key, value in data.items():
        if key not in fields and key not in initvars:
            valid = ", ".join(sorted(fields))
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise argparse.ArgumentTypeError(
                f"unknown key {prefix + key!r} for {flag}{hint}; valid keys: {valid}"
            )
        if key in fields and isinstance(value, dict):
            inner, _ = strip_optional(fields[key].annotation)
            if is_config_class(inner):
                check_keys(inner, value, flag, f"{prefix}{key}.")


class MergeJsonAction(argparse.Action):
    """A config-valued flag: every JSON piece is key-checked and deep-merged in order."""

    def __init__(self, *args: Any, config_cls: type | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_cls = config_cls

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        assert isinstance(values, dict), "type=parse_json_object guarantees a dict"
        if self.config_cls is not None:
            try:
                check_keys(self.config_cls, values, "/".join(self.option_strings))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
        current = getattr(namespace, self.dest, None)
        merged = deep_merge(current if isinstance(current, dict) else {}, values)
        setattr(namespace, self.dest, merged)

    def build(self, merged: dict[str, Any]) -> Any:
        """The config of the merged keys (``config_cls`` set); errors name the key's flag."""
        assert self.config_cls is not None
        try:
            return self.config_cls(**merged)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            short = min(self.option_strings, key=len)

            def flag_for(loc: tuple[Any, ...]) -> str:
                return ".".join([short, *map(str, loc)])

            message = reduce_error(exc, flag_for)
            # A message that names its key's flag stands alone; others get the flag.
            named = message.startswith(short + ".")
            raise argparse.ArgumentError(None if named else self, message) from None


def build_config_flags(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> None:
    """Turn the merged keys of every config-valued flag into its config object, as vLLM's
    parser does (``args.compilation_config.mode``); a flag not given gets the defaults.
    The keys stay in ``PIECES_ATTR`` so the engine can tell what the user set."""
    pieces = dict(getattr(namespace, PIECES_ATTR, {}))
    for action in parser._actions:
        if not isinstance(action, MergeJsonAction) or action.config_cls is None:
            continue
        value = getattr(namespace, action.dest, None)
        if isinstance(value, dict):
            pieces[action.dest] = value
            setattr(namespace, action.dest, action.build(value))
        elif value is None:
            setattr(namespace, action.dest, action.config_cls())
    if pieces:
        setattr(namespace, PIECES_ATTR, pieces)


# --------------------------------------------------------------------------
# Field -> add_argument kwargs
# --------------------------------------------------------------------------
def argparse_kwargs(annotation: Any) -> dict[str, Any] | None:
    """``add_argument`` keyword arguments for a field type, or None when not a CLI type."""
    tp, _ = strip_optional(annotation)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(tp) is Literal:
        values = typing.get_args(tp)
        return {"type": _literal_type(values), "choices": list(values)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        shown = [str(m.value) if issubclass(tp, int) else m.name for m in tp]
        return {"type": enum_parser(tp), "metavar": "{" + ",".join(shown) + "}"}
    scalar = _scalar_parser(tp)
    if scalar is not None:
        return {"type": scalar}
    origin = typing.get_origin(tp)
    if origin in (list, tuple, set, frozenset, Sequence) or tp in (list, tuple, set):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        elem = _scalar_parser(args[0]) if len(args) == 1 else None
        return {"type": elem or parse_json_or_str, "nargs": "+"}
    if is_config_class(tp) or tp is dict or origin is dict:
        return {
            "type": parse_json_object,
            "action": MergeJsonAction,
            "config_cls": tp if is_config_class(tp) else None,
            "metavar": "JSON",
        }
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(tp) if argparse_kwargs(a) is not None]
        if len(members) == 1:
            return argparse_kwargs(members[0])
        if members:
            return {"type": parse_json_or_str}
    return None


def help_text(doc: str, default: Any) -> str:
    """Argparse help: the field docstring plus its default (``%`` escaped for argparse)."""
    text = " ".join(doc.split())
    if isinstance(default, enum.Enum):
        shown: Any = default.name
    elif dataclasses.is_dataclass(default):
        shown = None  # a nested config; its keys are documented by its own fields
    else:
        shown = default
    if shown is not None and shown != [] and shown != {}:
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text.replace("%", "%%")


def add_field_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    option_strings: list[str],
    dest: str,
    annotation: Any,
    default: Any,
    doc: str,
    parse: Callable[[str], Any] | None = None,
) -> bool:
    """Register one field as a tracked flag; False when its type has no CLI form.

    ``parse`` replaces the value parser of a scalar flag (``human_readable_int``)."""
    kwargs = argparse_kwargs(annotation)
    if kwargs is None:
        return False
    if parse is not None and "nargs" not in kwargs and kwargs.get("type") in (int, str):
        kwargs["type"] = parse
        if parse in (human_readable_int, human_readable_int_or_auto):
            doc += HUMAN_READABLE_HELP
    action = kwargs.pop("action", "store")
    if isinstance(action, str):
        registry = parser._registries["action"]  # the registered class for "store"
        action = registry[action]
    text = help_text(doc, default)
    if isinstance(action, type) and issubclass(action, MergeJsonAction):
        default = None  # pieces merge into a dict; EngineArgs keeps its own default
        text += (
            f" One key at a time: {option_strings[-1]}.KEY=VALUE (nested: KEY.SUBKEY=VALUE;"
            " VALUE is JSON, else a string). Pieces merge in order, later ones win."
        )
    parser.add_argument(
        *option_strings,
        dest=dest,
        action=tracked_action(action),
        default=default,
        help=text,
        **kwargs,
    )
    return True


def reduce_error(exc: BaseException, flag_for: Callable[[tuple[Any, ...]], str] | None) -> str:
    """One line for a pydantic ValidationError or ValueError, naming the flag when known."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = []
        for err in errors():
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            loc = tuple(err.get("loc", ()))
            where = flag_for(loc) if (flag_for and loc) else ""
            got = f" (got {err['input']!r})" if loc and "input" in err else ""
            parts.append(f"{where}: {msg}{got}" if where else f"{msg}{got}")
        return " ".join("; ".join(parts).split())
    return " ".join(str(exc).split())
