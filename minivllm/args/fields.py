"""Turn config classes into an engine-arguments dataclass, and back into configs.

`engine_args_class` adds one field per user-settable field of every mapped
config class to an `EngineArgsBase` subclass, so `EngineArgs` follows the
config classes as they grow.  The same field table drives the flags
(`add_cli_args`), the reverse mapping (`create_engine_config`), the error
messages (a validation error names the flag) and the record of which config
paths the user set (for ``minivllm config --explain``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.parsing import (
    EXPLICIT_ATTR,
    PIECES_ATTR,
    ConfigField,
    add_field_argument,
    config_fields,
    is_config_class,
    reduce_error,
    strip_optional,
)
from minivllm.config.utils import field_docs

E = TypeVar("E", bound="EngineArgsBase")


@dataclasses.dataclass(frozen=True)
class ConfigTarget:
    """Which fields of one config class become engine arguments."""

    attr: str
    """Attribute of the root config holding this config (``""`` for the root's own fields)."""
    cls: type
    """The config class."""
    renames: dict[str, str] = dataclasses.field(default_factory=dict)
    """Config field -> engine argument name (``cache_dtype -> kv_cache_dtype``)."""
    exclude: frozenset[str] = frozenset()
    """Fields that are not user knobs (set from the model, or internal)."""
    only: frozenset[str] | None = None
    """When set, only these fields are exposed (used for the root config)."""
    derived: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """Field -> (earlier config attr, attribute) it is copied from; not a flag
    (``is_encoder_decoder`` comes from the model config)."""


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One engine argument and the config field it feeds."""

    arg_name: str
    """Engine-argument (and flag) name."""
    target: ConfigTarget
    """The config it belongs to."""
    field: ConfigField
    """The config field it sets."""
    doc: str
    """The field's docstring (help text)."""

    @property
    def path(self) -> str:
        """Dotted path in the root config, e.g. ``cache_config.block_size``."""
        return f"{self.target.attr}.{self.field.name}" if self.target.attr else self.field.name

    @property
    def flag(self) -> str:
        """The long flag, e.g. ``--block-size``."""
        return "--" + self.arg_name.replace("_", "-")

    @property
    def nested_cls(self) -> type | None:
        """The config class when this argument holds a whole nested config (``-cc``)."""
        tp, _ = strip_optional(self.field.annotation)
        return tp if is_config_class(tp) else None


def build_specs(
    targets: Iterable[ConfigTarget],
) -> tuple[list[ArgSpec], dict[str, list[tuple[str, ArgSpec]]]]:
    """The argument table, plus for each target the fields it shares with an earlier one.

    A field name that two configs share (``max_model_len`` in the model and the
    scheduler config) is one argument, owned by the first config; later configs
    receive the owner's *resolved* value.
    """
    specs: list[ArgSpec] = []
    seen: dict[str, ArgSpec] = {}
    shared: dict[str, list[tuple[str, ArgSpec]]] = {}
    for target in targets:
        docs = field_docs(target.cls)
        for f in config_fields(target.cls):
            if f.name in target.exclude or f.name in target.derived:
                continue
            if target.only is not None and f.name not in target.only:
                continue
            name = target.renames.get(f.name, f.name)
            if name in seen:
                owner = seen[name]
                if owner.target.attr and target.attr:
                    shared.setdefault(target.attr, []).append((f.name, owner))
                continue
            seen[name] = ArgSpec(name, target, f, docs.get(f.name, ""))
            specs.append(seen[name])
    return specs, shared


def _own_spec(spec: ArgSpec, annotation: Any, f: dataclasses.Field[Any]) -> ArgSpec:
    """``spec`` with the type and default of the engine-arguments field declared by hand."""
    factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
    own = ConfigField(spec.field.name, annotation, f.default, factory)
    return dataclasses.replace(spec, field=own)


def engine_args_class(
    root_cls: type,
    targets: list[ConfigTarget],
    aliases: dict[str, list[str]] | None = None,
    parsers: dict[str, Callable[[str], Any]] | None = None,
) -> Callable[[type[E]], type[E]]:
    """Class decorator: add the config fields of ``targets`` and make a dataclass.

    ``aliases`` gives arguments short flags (``-O``); ``parsers`` replaces the value
    parser of scalar arguments (``max_model_len``: ``1k``, ``auto``)."""

    def wrap(cls: type[E]) -> type[E]:
        specs, shared = build_specs(targets)
        annotations = cls.__dict__.get("__annotations__", {})
        cls.__annotations__ = annotations
        by_hand = [s for s in specs if s.arg_name in annotations]
        for spec in specs:
            if spec.arg_name in annotations:
                continue  # declared by hand in the class body
            annotations[spec.arg_name] = spec.field.annotation
            f = spec.field
            if spec.nested_cls is not None:
                # None becomes the default config in __post_init__ (so it is known as such).
                setattr(cls, spec.arg_name, None)
            elif f.default_factory is not None:
                setattr(cls, spec.arg_name, dataclasses.field(default_factory=f.default_factory))
            else:
                setattr(cls, spec.arg_name, None if f.default is dataclasses.MISSING else f.default)
        out = dataclasses.dataclass(cls)
        if by_hand:
            # A field declared by hand keeps its own type and default (flags and
            # "did the user set it" follow them), e.g. a None that means "per model".
            hints = typing.get_type_hints(out)
            fields = {f.name: f for f in dataclasses.fields(out)}
            own = {s.arg_name: s for s in by_hand}
            specs = [
                _own_spec(s, hints[s.arg_name], fields[s.arg_name]) if s.arg_name in own else s
                for s in specs
            ]
        out._root_cls = root_cls
        out._targets = tuple(targets)
        out._specs = tuple(specs)
        out._shared = shared
        out._aliases = dict(aliases or {})
        out._parsers = dict(parsers or {})
        return out

    return wrap


def _leaf_paths(prefix: str, value: Any, cls: type | None) -> set[str]:
    """Paths a nested config value sets: dict leaves, or fields differing from defaults."""
    if isinstance(value, dict):
        fields = {f.name: f for f in config_fields(cls)} if cls else {}
        out: set[str] = set()
        for key, item in value.items():
            inner = strip_optional(fields[key].annotation)[0] if key in fields else None
            sub = inner if is_config_class(inner) else None
            if isinstance(item, dict) and sub is not None:
                out |= _leaf_paths(f"{prefix}.{key}", item, sub)
            else:
                out.add(f"{prefix}.{key}")
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from minivllm.config.provenance import flatten

        mine, base = flatten(value, prefix), flatten(type(value)(), prefix)
        return {p for p, v in mine.items() if base.get(p, object()) != v}
    return {prefix}


class EngineArgsBase:
    """Shared behaviour of engine-argument dataclasses built by `engine_args_class`."""

    _root_cls: ClassVar[type]
    _targets: ClassVar[tuple[ConfigTarget, ...]]
    _specs: ClassVar[tuple[ArgSpec, ...]]
    _shared: ClassVar[dict[str, list[tuple[str, ArgSpec]]]]
    _aliases: ClassVar[dict[str, list[str]]]
    _parsers: ClassVar[dict[str, Callable[[str], Any]]]

    def __post_init__(self) -> None:
        # A config-valued argument is always a config object, as in vLLM: None gives the
        # defaults, a dict its keys (kept, so the engine knows which the user set).
        self._nested_defaults: dict[str, Any] = {}
        self._nested_pieces: dict[str, dict[str, Any]] = {}
        self._cli_explicit: set[str] = set()
        """Argument names given as flags (see `from_cli_args`, `set_user_arg`)."""
        for spec in self._specs:
            value = getattr(self, spec.arg_name)
            if spec.nested_cls is None or not (value is None or isinstance(value, dict)):
                continue
            if value is None:
                value = self._nested_defaults[spec.arg_name] = spec.nested_cls()
            else:
                self._nested_pieces[spec.arg_name] = value
                value = self._build(spec.nested_cls, value, spec.path)
            setattr(self, spec.arg_name, value)

    # -- command line ---------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per engine argument, grouped by config class."""
        if isinstance(parser, FlexibleArgumentParser):
            parser.add_config_file_argument()
        groups: dict[str, Any] = {}
        for spec in cls._specs:
            key = spec.target.cls.__name__
            if key not in groups:
                doc = (spec.target.cls.__doc__ or "").strip().split("\n")[0]
                groups[key] = parser.add_argument_group(key, doc)
            add_field_argument(
                groups[key],
                [spec.flag, *cls._aliases.get(spec.arg_name, [])],
                spec.arg_name,
                spec.field.annotation,
                spec.field.make_default(),
                spec.doc,
                cls._parsers.get(spec.arg_name),
            )
        return parser

    @classmethod
    def from_cli_args(cls: type[E], args: argparse.Namespace) -> E:
        """Engine arguments from a parsed namespace; remembers which flags were given."""
        kwargs: dict[str, Any] = {}
        # getattr: the namespace may come from a parser without some of these flags
        # (or without FlexibleArgumentParser's bookkeeping attributes).
        for spec in cls._specs:
            # None is what argparse holds for an absent JSON flag; the field default applies.
            value = getattr(args, spec.arg_name, None)
            if value is not None:
                kwargs[spec.arg_name] = value
        engine_args = cls(**kwargs)
        names = {s.arg_name for s in cls._specs}
        explicit = set(getattr(args, EXPLICIT_ATTR, ()))
        engine_args._cli_explicit = explicit & names
        pieces = getattr(args, PIECES_ATTR, {})
        engine_args._nested_pieces.update({k: v for k, v in pieces.items() if k in names})
        return engine_args

    # -- user-set tracking ----------------------------------------------------
    def set_user_arg(self, name: str, value: Any) -> None:
        """Set argument ``name`` as if its flag had been given (e.g. a positional MODEL)."""
        if name not in {s.arg_name for s in self._specs}:
            raise ValueError(f"{type(self).__name__} has no argument {name!r}")
        setattr(self, name, value)
        self._cli_explicit = self._cli_explicit | {name}

    def user_set_args(self) -> set[str]:
        """Argument names given on the command line or changed from their defaults."""
        names = self._cli_explicit | set(self._nested_pieces)
        for spec in self._specs:
            value = getattr(self, spec.arg_name)
            if spec.nested_cls is not None:
                # A config object counts once it is not the default made in __post_init__.
                if value is not None and value is not self._nested_defaults.get(spec.arg_name):
                    names.add(spec.arg_name)
            elif value != spec.field.make_default():
                names.add(spec.arg_name)
        return names

    def user_set_paths(self) -> set[str]:
        """Config paths the user set, e.g. ``{"cache_config.block_size", "compilation_config.mode"}``."""
        by_name = {s.arg_name: s for s in self._specs}
        paths: set[str] = set()
        for name in self.user_set_args():
            spec = by_name[name]
            if spec.nested_cls is not None:
                if name in self._nested_pieces:
                    paths |= _leaf_paths(spec.path, self._nested_pieces[name], spec.nested_cls)
                paths |= _leaf_paths(spec.path, getattr(self, name), spec.nested_cls)
                continue
            paths.add(spec.path)
            for attr, pairs in self._shared.items():
                paths |= {f"{attr}.{name}" for name, owner in pairs if owner is spec}
        return paths

    # -- configs ----------------------------------------------------------------
    def _flag_for_path(self, path: str) -> str:
        """The flag that sets config ``path`` (``-cc.pass_config.x`` for nested keys)."""
        for spec in self._specs:
            if path == spec.path:
                return spec.flag
            if spec.nested_cls is not None and path.startswith(spec.path + "."):
                short = self._aliases.get(spec.arg_name, [spec.flag])[0]
                return f"{short}.{path[len(spec.path) + 1 :]}"
        return path

    def _mentioned_flag(self, message: str, prefix: str) -> str | None:
        """For an error without a location: the flag of a field the message names.

        Fields the user set are preferred; other fields of the failing config are
        considered only below the root, where the message is about that config.
        """

        def under(path: str) -> bool:
            return not prefix or path == prefix or path.startswith(prefix + ".")

        groups = [sorted(p for p in self.user_set_paths() if under(p))]
        if prefix:
            groups.append([s.path for s in self._specs if under(s.path)])
        for group in groups:
            hits = []
            for path in group:
                word = re.search(rf"\b{re.escape(path.rsplit('.', 1)[-1])}\b", message)
                if word is not None:
                    hits.append((word.start(), path))
            if hits:
                return self._flag_for_path(min(hits)[1])
        return None

    def _build(self, cls: type, kwargs: dict[str, Any], prefix: str) -> Any:
        """``cls(**kwargs)``; an error becomes one ValueError line naming the flag at fault."""
        try:
            return cls(**kwargs)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError

            def flag_for(loc: tuple[Any, ...]) -> str:
                parts = [prefix, *map(str, loc)] if prefix else [str(p) for p in loc]
                return self._flag_for_path(".".join(parts))

            message = reduce_error(exc, flag_for)
            errors = exc.errors() if callable(getattr(exc, "errors", None)) else []  # type: ignore[attr-defined]
            if not any(err.get("loc") for err in errors):
                flag = self._mentioned_flag(message, prefix)
                if flag is not None and not message.startswith(flag):
                    message = f"{flag}: {message}"
            raise ValueError(message) from None

    def _nested_value(self, spec: ArgSpec) -> Any:
        """A fresh config for the root: rebuilt from the user's keys when known (so it
        is resolved on the platform in force now), else a copy of the given object."""
        value = getattr(self, spec.arg_name)
        pieces = self._nested_pieces.get(spec.arg_name)
        if value is None or value is self._nested_defaults.get(spec.arg_name):
            pieces = {}
        if pieces is not None:
            return self._build(spec.nested_cls, pieces, spec.path)  # type: ignore[arg-type]
        if isinstance(value, dict):
            return self._build(spec.nested_cls, value, spec.path)  # type: ignore[arg-type]
        return copy.deepcopy(value)  # resolution must not change the caller's object

    def create_engine_config(self) -> Any:
        """Build every config, then the root config, recording the user-set paths."""
        built: dict[str, Any] = {}
        for target in self._targets:
            if not target.attr:
                continue
            kwargs = {
                s.field.name: getattr(self, s.arg_name)
                for s in self._specs
                if s.target.attr == target.attr
            }
            for name, owner in self._shared.get(target.attr, []):
                kwargs[name] = getattr(built[owner.target.attr], owner.field.name)
            for name, (source, attribute) in target.derived.items():
                if hasattr(built.get(source), attribute):
                    kwargs[name] = getattr(built[source], attribute)
            self._resolve_unset(target.attr, kwargs, built)
            built[target.attr] = self._build(target.cls, kwargs, target.attr)
        user_paths = self.user_set_paths()
        given = self.user_set_args()
        for spec in self._specs:
            if spec.target.attr:
                continue
            if spec.nested_cls is None:
                built[spec.field.name] = getattr(self, spec.arg_name)
                continue
            nested = built[spec.field.name] = self._nested_value(spec)
            if spec.arg_name in given:
                # Whatever differs from the defaults came from the user's keys, including
                # fields an old spelling was translated into (``level`` -> ``mode``).
                user_paths |= _leaf_paths(spec.path, nested, spec.nested_cls)
        return self._build_root(built, user_paths)

    def _resolve_unset(self, attr: str, kwargs: dict[str, Any], built: dict[str, Any]) -> None:
        """Fill the ``kwargs`` of config ``attr`` that the arguments leave to be decided
        (None) from the configs ``built`` so far; subclasses say which."""

    def _build_root(self, kwargs: dict[str, Any], user_paths: set[str]) -> Any:
        """Construct the root config; subclasses adapt how user-set paths are handed over."""
        return self._build(self._root_cls, kwargs, "")
