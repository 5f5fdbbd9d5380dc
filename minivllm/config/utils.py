"""Helpers shared by every config class: the ``@config`` decorator and hashing.

A config's hash decides whether compiled artifacts can be reused, so it must be
stable across processes: factors are normalized to JSON-able values (enums by
name, sets sorted, callables by qualified name) and hashed with sha256.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable
from pathlib import PurePath
from typing import Any, ClassVar, TypeVar

from pydantic import ConfigDict, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import ArgsKwargs

T = TypeVar("T")

CONFIG_DICT = ConfigDict(arbitrary_types_allowed=True, extra="forbid", validate_assignment=False)


def config(cls: type[T]) -> type[T]:
    """Make ``cls`` a pydantic dataclass that rejects unknown fields."""
    return pydantic_dataclass(cls, config=CONFIG_DICT)  # type: ignore[return-value]


def normalize_value(value: Any) -> Any:
    """A JSON-able, process-independent form of ``value`` for hashing."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        compute_hash = getattr(value, "compute_hash", None)
        if callable(compute_hash):
            return compute_hash()
        return {f.name: normalize_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {
            str(k): normalize_value(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
        }
    if isinstance(value, (set, frozenset)):
        return sorted((normalize_value(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [normalize_value(v) for v in value]
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", "")
        name = getattr(value, "__qualname__", getattr(value, "__name__", repr(value)))
        return f"{module}.{name}"
    # torch.dtype and other objects with a stable str()
    return str(value)


def get_hash_factors(config_obj: Any, ignored_factors: set[str]) -> dict[str, Any]:
    """Every dataclass field of ``config_obj`` not in ``ignored_factors``, normalized."""
    factors: dict[str, Any] = {}
    for f in dataclasses.fields(config_obj):
        if f.name in ignored_factors or f.name.startswith("_"):
            continue
        factors[f.name] = normalize_value(getattr(config_obj, f.name))
    return factors


def hash_factors(factors: Any) -> str:
    """sha256 hex digest of the canonical JSON of ``factors``."""
    text = json.dumps(normalize_value(factors), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def getattr_iter(obj: Any, names: list[str], default: Any = None) -> Any:
    """The first of ``names`` that ``obj`` has (HF configs spell fields differently)."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a config class (for --help and --explain)."""
    import ast
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for prev, node in zip(body, body[1:], strict=False):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = inspect.cleandoc(node.value.value)
    return docs


def unsupported(what: str, why: str) -> Callable[..., None]:
    """A post-init hook body for sub-configs of subsystems minivllm does not have."""

    def check(*_: Any) -> None:
        raise ValueError(f"{what} is not supported by minivllm: {why}")

    return check


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def non_default_fields(config_obj: Any) -> dict[str, Any]:
    """``{name: value}`` of the init fields of ``config_obj`` that differ from their defaults."""
    changed: dict[str, Any] = {}
    for f in dataclasses.fields(config_obj):
        if not f.init:
            continue
        default = _field_default(f)
        value = getattr(config_obj, f.name)
        if default is dataclasses.MISSING or value != default:
            changed[f.name] = value
    return changed


def _refusal(feature: str, changed: dict[str, Any]) -> str:
    if changed:
        settings = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        detail = f" (got {settings}); leave these fields at their defaults"
    else:
        detail = ""
    return (
        f"{feature} is not supported by minivllm{detail}. Remove this setting to run with minivllm."
    )


class UnsupportedFeature:
    """Mixin for the sub-configs of subsystems minivllm does not have.

    The class keeps vLLM's fields (so configs written for vLLM parse), but:

    - constructing it with any field different from its default raises a
      ``ValueError`` that names the feature (``FEATURE``);
    - ``check_supported()``, which `VllmConfig` calls on every sub-config it
      holds, raises as well when ``ACTIVE_WHEN_PRESENT`` is true, i.e. when
      merely passing the config switches the subsystem on (LoRA, speculative
      decoding, ...). Configs that are always present (``structured_outputs_config``)
      leave it false: their defaults are inert.
    """

    FEATURE: ClassVar[str] = "this feature"
    """Human-readable name used in error messages, e.g. "LoRA (lora_config)"."""
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = False
    """Whether a default-constructed instance already enables the subsystem."""
    SUPPORTED: ClassVar[bool] = False
    """Always False here; supported configs do not use this mixin."""

    def __post_init__(self) -> None:
        changed = non_default_fields(self)
        if changed:
            self._raise(changed)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, data: Any) -> Any:
        """A field this class lacks (one of a newer vLLM, say) gets the feature's refusal
        too, not pydantic's "unexpected keyword argument": the whole feature is refused."""
        kwargs = data.kwargs if isinstance(data, ArgsKwargs) else data
        if isinstance(kwargs, dict):
            known = getattr(cls, "__dataclass_fields__", {})
            unknown = {k: v for k, v in kwargs.items() if k not in known}
            if unknown:
                raise ValueError(_refusal(cls.FEATURE, unknown))
        return data

    def _raise(self, changed: dict[str, Any]) -> None:
        raise ValueError(_refusal(self.FEATURE, changed))

    def check_supported(self) -> None:
        """Raise ``ValueError`` when this config would switch on the unsupported feature."""
        changed = non_default_fields(self)
        if changed or self.ACTIVE_WHEN_PRESENT:
            self._raise(changed)
