"""The routes of the Messages API, and the middleware that gives their errors
Anthropic's shape.

Every error answer under /v1/messages (a bad body, a wrong API key, a body too large,
an unknown model, an engine failure) is written by the server's shared handlers in
OpenAI's shape; `AnthropicErrorMiddleware` rewrites it as
``{"type": "error", "error": {"type", "message"}}`` on its way out, so Anthropic's
clients raise their own typed errors.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minivllm.entrypoints.openai.anthropic.protocol import (
    AnthropicErrorResponse,
    CountTokensRequest,
    MessagesRequest,
    MessagesResponse,
    TokenCount,
)
from minivllm.entrypoints.openai.anthropic.serving import (
    AnthropicServingMessages,
    anthropic_error,
)
from minivllm.entrypoints.openai.routes import generation_handler
from minivllm.entrypoints.openai.server_utils import SSE_CONTENT

MESSAGES_PATH = "/v1/messages"
"""The Messages API's paths start here."""

_DESCRIPTIONS = {
    400: "Bad request (invalid_request_error)",
    401: "Missing or wrong API key (authentication_error)",
    404: "The model named in the request is not served here (not_found_error)",
    413: "The request body is larger than --max-request-body-bytes (request_too_large)",
    500: "The engine failed while serving this request (api_error)",
    503: "The server is shutting down or its engine has stopped (overloaded_error)",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": AnthropicErrorResponse, "description": text}
    for code, text in _DESCRIPTIONS.items()
}
"""The documented error answers of the Messages routes (Anthropic's error body)."""


def add_messages_routes(app: FastAPI, messages: AnthropicServingMessages) -> None:
    """/v1/messages and /v1/messages/count_tokens."""
    create = generation_handler(messages.create_message)
    count = generation_handler(messages.count_tokens)

    @app.post(
        MESSAGES_PATH,
        response_model=MessagesResponse,
        responses={200: {"content": SSE_CONTENT}, **ERRORS},
    )
    async def create_message(request: MessagesRequest, raw_request: Request) -> Response:
        return await create(request, raw_request)

    @app.post(f"{MESSAGES_PATH}/count_tokens", response_model=TokenCount, responses=ERRORS)
    async def count_tokens(request: CountTokensRequest, raw_request: Request) -> Response:
        return await count(request, raw_request)


def _anthropic_body(status: int, body: bytes) -> bytes:
    """An error body in Anthropic's shape (kept when it is one already)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error":
        return body
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    text = str(message) if message is not None else body.decode("utf-8", "replace")
    return json.dumps(anthropic_error(status, text), ensure_ascii=True).encode()


class AnthropicErrorMiddleware:
    """Pure ASGI middleware: error answers under /v1/messages in Anthropic's shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(MESSAGES_PATH):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is complete
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _anthropic_body(start["status"], b"".join(chunks))
            headers = [h for h in start.get("headers", []) if h[0] != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewrite)
