"""Pieces of the API server that are not routes: the error response, the API-key and
body-size middlewares (pure ASGI, so streaming is unaffected), and the OpenAPI
document's error answers."""

from __future__ import annotations

import hmac
import json
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
)
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20
"""Default cap on a request body (16 MiB): a full 128k-token context as text or token
ids fits with room to spare; larger bodies get a 413 before anything parses them."""

OPEN_PATHS = frozenset({"/health", "/version", "/metrics", "/openapi.json", "/docs", "/redoc"})
"""Paths that need no API key."""


class _ErrorJSONResponse(JSONResponse):
    """An error body, ASCII-escaped: it renders whatever text a message quotes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(err: OpenAIServingError, headers: dict[str, str] | None = None) -> JSONResponse:
    return _ErrorJSONResponse(
        err.to_response().model_dump(), status_code=int(err.status), headers=headers
    )


class APIKeyMiddleware:
    """Pure ASGI middleware (streaming-safe): every path but `OPEN_PATHS` needs
    ``Authorization: Bearer <api_key>`` (or Anthropic's ``x-api-key: <api_key>``); a 401
    says so in ``WWW-Authenticate``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_x_api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] != "OPTIONS"
            and scope["path"] not in OPEN_PATHS
        ):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            x_api_key = headers.get(b"x-api-key", b"")
            if not (
                hmac.compare_digest(given, self.expected)
                or hmac.compare_digest(x_api_key, self.expected_x_api_key)
            ):
                err = OpenAIServingError(
                    "Unauthorized: a valid API key is needed (Authorization: Bearer <key>)",
                    HTTPStatus.UNAUTHORIZED,
                )
                headers = {"WWW-Authenticate": "Bearer"}
                await error_response(err, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestIdMiddleware:
    """Pure ASGI middleware: every response carries ``X-Request-Id``, the client's own
    when it sent one (so its logs and ours line up), else a fresh id of the server's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"")
        # Echo only a sane header value (printable ASCII, bounded); else make one.
        if not (0 < len(given) <= 256 and given.isascii() and given.decode().isprintable()):
            given = uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", given)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyTooLargeError(StarletteHTTPException):
    """The request body went past the server's limit while it was being read."""


class BodySizeLimitMiddleware:
    """Pure ASGI middleware: a body over ``max_bytes`` gets a 413 with OpenAI's error body.

    The declared Content-Length is checked before anything is read; a body sent without
    one (chunked) is counted as it streams in, and reading stops at the limit, so an
    oversized body is never buffered, parsed or tokenized.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> OpenAIServingError:
        return OpenAIServingError(
            f"the request body is larger than this server's limit of {self.max_bytes} bytes "
            "(--max-request-body-bytes); send a smaller request",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(self._error())(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    err = self._error()
                    raise BodyTooLargeError(int(err.status), err.message)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLargeError:
            # Raised where nothing turned it into a response (outside a route).
            if not started:
                await error_response(self._error())(scope, receive, send)


_ERROR_DESCRIPTIONS = {
    400: "Bad request: malformed JSON, a wrongly typed field or an out-of-range value",
    401: "Missing or wrong API key (only when the server runs with --api-key)",
    404: "The model named in the request is not served here",
    413: "The request body is larger than --max-request-body-bytes",
    500: "The engine failed while serving this request",
    503: "The server is shutting down or its engine has stopped",
}


def documented_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers ``codes`` (all with OpenAI's error body)."""
    return {
        code: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[code]} for code in codes
    }


GENERATION_ERRORS = documented_errors(400, 401, 404, 413, 500, 503)
SSE_CONTENT = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "description": "One server-sent event: its data is a JSON chunk (or an error "
            "body), and the last event's data is [DONE].",
            "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
            "required": ["data"],
        }
    }
}
"""A ``stream: true`` request is answered with server-sent events (schema: one event)."""


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_bounds(documented: Any, exact: Any) -> None:
    """Copy pydantic's integer bounds over FastAPI's, which it turns into floats (2**64 - 1,
    the largest seed, would read 1.8446744073709552e+19)."""
    if isinstance(documented, dict) and isinstance(exact, dict):
        for key, value in exact.items():
            if key in _BOUNDS and isinstance(value, int):
                documented[key] = value
            elif key in documented:
                _exact_bounds(documented[key], value)
    elif isinstance(documented, list) and isinstance(exact, list):
        for doc_item, exact_item in zip(documented, exact, strict=False):
            _exact_bounds(doc_item, exact_item)


_TOKEN_ID_FIELDS = {"prompt", "stop_token_ids", "allowed_token_ids", "tokens"}
"""Request fields that hold token ids (alone or in nested arrays)."""
_TOKEN_COUNT_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")
_LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")


def _schemas(node: Any, type_name: str) -> list[dict[str, Any]]:
    """Every ``{"type": type_name}`` schema in ``node``, through anyOf, oneOf and items."""
    if isinstance(node, list):
        return [found for item in node for found in _schemas(item, type_name)]
    if not isinstance(node, dict):
        return []
    found = [node] if node.get("type") == type_name else []
    for key in ("anyOf", "oneOf", "items"):
        if key in node:
            found += _schemas(node[key], type_name)
    return found


_BOUNDED_REQUESTS = ("CompletionRequest", "ChatCompletionRequest", "DetokenizeRequest",
                     "TokenizeCompletionRequest", "TokenizeChatRequest")  # fmt: skip
"""The request schemas that get the server's ranges."""


def _server_bounds(schemas: dict[str, Any], limits: ServerLimits) -> None:
    """The ranges this server enforces at run time, written into the request schemas:
    token ids within the vocabulary, token counts within max_model_len, logprobs up to
    max_logprobs.  Clients (and fuzzers) then see which values can succeed."""
    for name in _BOUNDED_REQUESTS:
        properties = schemas.get(name, {}).get("properties", {})
        for field, prop in properties.items():
            _bound_field(name, field, prop, limits)


def _bound_field(request: str, field: str, prop: Any, limits: ServerLimits) -> None:
    """The server's range for one field of ``request``'s schema (in place)."""
    if field in _TOKEN_ID_FIELDS:
        _bound_token_ids(request, field, prop, limits.vocab_size)
    elif field == "messages":  # a chat template renders no empty conversation
        for node in _schemas(prop, "array"):
            node["minItems"] = 1
    elif field in _TOKEN_COUNT_FIELDS:
        for node in _schemas(prop, "integer"):
            node["maximum"] = limits.max_model_len - 1
    elif field in _LOGPROB_FIELDS:
        for node in _schemas(prop, "integer"):
            node["maximum"] = limits.max_logprobs


def _bound_token_ids(request: str, field: str, prop: Any, vocab_size: int) -> None:
    for node in _schemas(prop, "integer"):
        node.update(minimum=0, maximum=vocab_size - 1)
    if field != "tokens":  # /detokenize of no tokens is the empty text
        for node in _schemas(prop, "array"):
            node["minItems"] = 1
    if field == "prompt" and request != "TokenizeCompletionRequest":
        for node in _schemas(prop, "string"):  # an empty prompt has no token
            node["minLength"] = 1


@dataclass(frozen=True)
class ServerLimits:
    """What the engine allows, for the OpenAPI document's value ranges."""

    vocab_size: int
    max_model_len: int
    max_logprobs: int = 20


def openapi_schema(app: FastAPI, limits: ServerLimits | None = None) -> dict[str, Any]:
    """FastAPI's document, less the 422 it lists for every body (this server answers
    400 instead), with exact integer bounds and (given ``limits``) the engine's ranges."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            operation.get("responses", {}).pop("422", None)
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for model in (CompletionRequest, ChatCompletionRequest):
        if model.__name__ in schemas:
            _exact_bounds(schemas[model.__name__], model.model_json_schema())
    if limits is not None:
        _server_bounds(schemas, limits)
    return schema
