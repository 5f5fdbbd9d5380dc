"""Per-request limits on a constraint, checked before anything compiles it.

Every walk here is iterative: a request chooses how deeply its schema nests, so no
recursion may follow that depth (Python's stack would run out long before memory).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.config.structured_outputs import StructuredOutputsConfig

XGRAMMAR_IGNORED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
    }
)
"""JSON schema keywords xgrammar compiles by ignoring them (measured on xgrammar 0.2.9:
the grammar comes out the same without them), so the output would not honour them."""

_SCHEMA_VALUED = ("items", "additionalItems", "additionalProperties", "not", "if", "then")
_SCHEMA_VALUED_MORE = ("else", "contains", "propertyNames", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def flag(name: str) -> str:
    """The command-line spelling of a StructuredOutputsConfig field."""
    return f"--structured-outputs-config.{name}"


def check_spec_size(text: str, what: str, config: StructuredOutputsConfig) -> None:
    """ValueError when ``text`` is over max_spec_bytes."""
    limit = config.max_spec_bytes
    # A str holds at most 4 UTF-8 bytes a character: skip encoding short texts.
    size = len(text) if len(text) * 4 <= limit else len(text.encode("utf-8", "replace"))
    if size > limit:
        raise ValueError(
            f"the {what} is {size} bytes, over the limit max_spec_bytes={limit} "
            f"({flag('max_spec_bytes')}); send a smaller one"
        )


def check_depth(value: Any, what: str, config: StructuredOutputsConfig) -> None:
    """ValueError when JSON ``value`` nests objects/arrays deeper than max_spec_depth."""
    limit = config.max_spec_depth
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth > limit:
            raise ValueError(
                f"the {what} nests deeper than max_spec_depth={limit} levels of objects "
                f"and arrays ({flag('max_spec_depth')}); flatten it"
            )
        stack.extend((child, depth + 1) for child in children)


def load_json(text: str, what: str, config: StructuredOutputsConfig) -> Any:
    """``json.loads(text)`` after the size limit; ValueError for bad or too-deep JSON."""
    check_spec_size(text, what, config)
    try:
        value = json.loads(text)
    except RecursionError:  # deeper than the parser's own stack guard
        raise ValueError(
            f"the {what} nests deeper than max_spec_depth={config.max_spec_depth} levels "
            f"({flag('max_spec_depth')}); flatten it"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the {what} is not valid JSON: {exc}") from None
    check_depth(value, what, config)
    return value


def subschemas(schema: dict[str, Any]) -> list[Any]:
    """The schemas directly inside ``schema`` (not const/enum/default values)."""
    found: list[Any] = []
    for key in _SCHEMA_VALUED + _SCHEMA_VALUED_MORE:
        child = schema.get(key)
        if isinstance(child, (dict, bool)):
            found.append(child)
    for key in _SCHEMA_LISTS:
        child = schema.get(key)
        if isinstance(child, list):
            found.extend(child)
    for key in _SCHEMA_MAPS:
        child = schema.get(key)
        if isinstance(child, dict):
            found.extend(child.values())
    return found


def check_schema(schema: Any) -> None:
    """ValueError for what no backend can enforce: an external ``$ref`` (minivllm
    never fetches one; xgrammar would drop the constraint) or ``"not"``."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise ValueError(
                f"the JSON schema refers to an external document ($ref {ref[:200]!r}); "
                'structured outputs never fetch schemas: put it under "$defs" and refer '
                'to it as "#/$defs/NAME"'
            )
        if "not" in node:
            raise ValueError(
                'the JSON schema uses "not", which structured outputs cannot enforce '
                '(and {"not": {}} accepts nothing); remove it'
            )
        stack.extend(subschemas(node))


def xgrammar_ignored(schema: Any) -> list[str]:
    """The keywords of ``schema`` (anywhere in it) that xgrammar would ignore."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        found.update(k for k in node if k in XGRAMMAR_IGNORED_KEYWORDS)
        if node.get("uniqueItems") is True:
            found.add("uniqueItems")
        stack.extend(subschemas(node))
    return sorted(found)
