"""The field table of `EngineArgs`: which config fields become engine arguments.

`build_specs` walks the config classes `EngineArgs` maps (`ConfigTarget`) and
returns one `ArgSpec` per user-settable field; `with_config_fields` makes those
the dataclass fields of `EngineArgs`, so a field added to a config is an engine
argument and a flag at once.  The same table drives the flags, the reverse
mapping to configs, error messages that name the flag, and the record of which
config paths the user set.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from minivllm.args.parsing import ConfigField, config_fields, is_config_class, strip_optional
from minivllm.config.utils import field_docs

T = TypeVar("T")


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


def with_config_fields(specs: list[ArgSpec]) -> Callable[[type[T]], type[T]]:
    """Class decorator: one dataclass field per argument of ``specs``, then `dataclass`.

    A field declared by hand in the class body keeps its own type and default (flags
    and "did the user set it" follow them, e.g. a None that means "per model"); the
    class gets the final table as ``_specs``."""

    def wrap(cls: type[T]) -> type[T]:
        annotations = cls.__dict__.get("__annotations__", {})
        cls.__annotations__ = annotations
        by_hand = {s.arg_name for s in specs if s.arg_name in annotations}
        for spec in specs:
            if spec.arg_name in by_hand:
                continue
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
        hints = typing.get_type_hints(out)
        fields = {f.name: f for f in dataclasses.fields(out)}
        out._specs = tuple(  # type: ignore[attr-defined]
            _own_spec(s, hints[s.arg_name], fields[s.arg_name]) if s.arg_name in by_hand else s
            for s in specs
        )
        return out

    return wrap


def leaf_paths(prefix: str, value: Any, cls: type | None) -> set[str]:
    """Paths a nested config value sets: dict leaves, or fields differing from defaults."""
    if isinstance(value, dict):
        fields = {f.name: f for f in config_fields(cls)} if cls else {}
        out: set[str] = set()
        for key, item in value.items():
            inner = strip_optional(fields[key].annotation)[0] if key in fields else None
            sub = inner if is_config_class(inner) else None
            if isinstance(item, dict) and sub is not None:
                out |= leaf_paths(f"{prefix}.{key}", item, sub)
            else:
                out.add(f"{prefix}.{key}")
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from minivllm.config.provenance import flatten

        mine, base = flatten(value, prefix), flatten(type(value)(), prefix)
        return {p for p, v in mine.items() if base.get(p, object()) != v}
    return {prefix}
