"""A bounded schemathesis run against the server's own /openapi.json: no 5xx, and every
answer matches the document (status codes, content types, headers, bodies).

The document carries the engine's ranges (token ids within the vocabulary, token
counts within max_model_len), so generated requests reach the engine and many are
served (the test asserts that some are), not only refused with a 400.

Two of schemathesis's checks are left out on purpose: ``negative_data_rejection``
(pydantic's lax mode takes ``"true"`` for a boolean and ``true`` for an integer, as
vLLM does) and ``positive_data_acceptance`` (rules across fields, such as
``min_tokens <= max_tokens`` or a prompt plus max_tokens within max_model_len, cannot
be written in JSON Schema; such requests get a 400 with a message, as they should).
"""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest
from server_utils import RemoteServer

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

MAX_MODEL_LEN = 256
SERVER_ARGS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # fmt: skip
MAX_EXAMPLES = 10
"""Examples per operation in the fuzzing phase (the coverage phase adds its own)."""
GENERATION = ("/v1/completions", "/v1/chat/completions")
CAPPED = {"/v1/responses": "max_output_tokens", "/v1/messages": "max_tokens"}
"""Other generation paths and their token cap."""

_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
_DEEP: dict[str, Any] = {"type": "string"}
for _ in range(40):
    _DEEP = {"type": "object", "properties": {"a": _DEEP}}
CONSTRAINTS: list[tuple[str, dict[str, Any]]] = [
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}),
    ("json_object", {"response_format": {"type": "json_object"}}),
    ("so_regex", {"structured_outputs": {"regex": "[a-z]{1,5}"}}),
    ("so_choice", {"structured_outputs": {"choice": ["yes", "no"]}}),
    ("guided_json", {"guided_json": {"type": "array", "items": {"type": "boolean"}}}),
    ("guided_regex", {"guided_regex": "(ab"}),  # not a regex: a 400
    ("guided_choice", {"guided_choice": []}),
    ("deep_schema", {"structured_outputs": {"json": _DEEP}}),
    ("two_constraints", {"guided_regex": "a+", "guided_choice": ["a"]}),
    ("tool_named", {"tools": [_TOOL],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ("tool_unknown", {"tools": [_TOOL],
                      "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    ("tool_auto", {"tools": [_TOOL], "tool_choice": "auto"}),
    ("tool_required", {"tools": [_TOOL], "tool_choice": "required"}),
    ("tool_bad_params", {"tools": [{"type": "function",
                                    "function": {"name": "f", "parameters": "x"}}]}),
]  # fmt: skip
"""Structured-output and tool fields laid over every other generated generation request
(tools only on chat), so that the fuzzed fields meet grammars and tool calls: good
ones, and ones the server must refuse with a 4xx."""

STATUSES: collections.Counter[tuple[str, int]] = collections.Counter()
CONSTRAINED: collections.Counter[tuple[str, int]] = collections.Counter()
_NUM_GENERATION = [0]
REASONS: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def api_schema(server: RemoteServer) -> Any:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_matches_its_openapi_document(case: Any) -> None:
    if case.path in GENERATION and isinstance(case.body, dict):
        # Keep each generation short (an unset max_tokens of a chat request means "up to
        # max_model_len"): the fuzz is about the answers, not throughput.
        for field in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(field)
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                case.body[field] = min(value or 2, 2)
        if isinstance(case.body.get("n"), int):
            case.body["n"] = min(case.body["n"], 2)
        constraint = _lay_constraint(case)
    else:
        constraint = None
        if case.path in CAPPED and isinstance(case.body, dict):
            value = case.body.get(CAPPED[case.path])
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                case.body[CAPPED[case.path]] = min(value or 2, 2)
    response = case.call_and_validate(
        timeout=60, excluded_checks=[negative_data_rejection, positive_data_acceptance]
    )
    STATUSES[(case.path, response.status_code)] += 1
    if constraint is not None:
        CONSTRAINED[(constraint, response.status_code)] += 1
    if response.status_code == 400 and case.path in GENERATION:
        REASONS[response.json()["error"]["message"][:50]] += 1


def _lay_constraint(case: Any) -> str | None:
    """Lay the next of `CONSTRAINTS` over every other generation request; its name."""
    _NUM_GENERATION[0] += 1
    if _NUM_GENERATION[0] % 2:
        return None
    usable = [c for c in CONSTRAINTS if case.path.endswith("chat/completions") or
              not c[0].startswith("tool")]  # fmt: skip
    name, fields = usable[(_NUM_GENERATION[0] // 2) % len(usable)]
    case.body.update(json.loads(json.dumps(fields)))
    return name


def test_fuzzing_reached_the_engine() -> None:
    """Runs after the fuzz: generation requests were served, not only refused."""
    served = sum(STATUSES[(path, 200)] for path in GENERATION)
    print(f"\nfuzz answers (path, status): {dict(sorted(STATUSES.items()))}")
    print(REASONS.most_common(25))
    print(f"constrained answers (constraint, status): {dict(sorted(CONSTRAINED.items()))}")
    assert not [k for k in STATUSES if k[1] >= 500], STATUSES
    assert served >= 5, STATUSES
    # Some structured or tool requests were served, and each kind was sent.
    assert sum(n for (_, status), n in CONSTRAINED.items() if status == 200) >= 2, CONSTRAINED
    assert {name for name, _ in CONSTRAINED} >= {c[0] for c in CONSTRAINTS[:9]}, CONSTRAINED
