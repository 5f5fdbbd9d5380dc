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
from typing import Any

import pytest
from server_utils import RemoteServer

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

MAX_MODEL_LEN = 256
SERVER_ARGS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16")
MAX_EXAMPLES = 10
"""Examples per operation in the fuzzing phase (the coverage phase adds its own)."""
GENERATION = ("/v1/completions", "/v1/chat/completions")

STATUSES: collections.Counter[tuple[str, int]] = collections.Counter()
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
    response = case.call_and_validate(
        timeout=60, excluded_checks=[negative_data_rejection, positive_data_acceptance]
    )
    STATUSES[(case.path, response.status_code)] += 1
    if response.status_code == 400 and case.path in GENERATION:
        REASONS[response.json()["error"]["message"][:50]] += 1


def test_fuzzing_reached_the_engine() -> None:
    """Runs after the fuzz: generation requests were served, not only refused."""
    served = sum(STATUSES[(path, 200)] for path in GENERATION)
    print(f"\nfuzz answers (path, status): {dict(sorted(STATUSES.items()))}")
    print(REASONS.most_common(25))
    assert not [k for k in STATUSES if k[1] >= 500], STATUSES
    assert served >= 5, STATUSES
