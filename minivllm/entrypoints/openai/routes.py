"""The routes of the OpenAI-compatible server and its exception handlers, added to a
FastAPI app by `api_server.build_app` in named steps.

Every failure becomes OpenAI's error body ``{"error": {message, type, param, code}}``:
a malformed or wrongly typed body is a 400 (FastAPI's 422 is overridden), an
unknown model a 404, an engine failure a 500.  A client that goes away while its
request runs has the request cancelled (its engine requests aborted), quietly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm import __version__
from minivllm.engine.async_llm import AsyncLLM
from minivllm.entrypoints.openai.metrics import CONTENT_TYPE_LATEST, PrometheusStatLogger
from minivllm.entrypoints.openai.protocol import (
    UNION_TAGS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from minivllm.entrypoints.openai.server_utils import (
    GENERATION_ERRORS,
    SSE_CONTENT,
    documented_errors,
    error_response,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.entrypoints.openai.anthropic.serving import AnthropicServingMessages
    from minivllm.entrypoints.openai.responses.serving import OpenAIServingResponses

logger = init_logger(__name__)


@dataclass
class Handlers:
    """The endpoint handlers the routes call."""

    models: OpenAIServingModels
    completion: OpenAIServingCompletion
    chat: OpenAIServingChat
    tokenization: OpenAIServingTokenization
    responses: OpenAIServingResponses
    messages: AnthropicServingMessages


def _field_of(loc: tuple[Any, ...]) -> str:
    """The dotted field path of an error's ``loc``, without the union members pydantic
    puts in it (``str``, ``list[int]``, ``function-after[...]``)."""
    parts = [str(p) for p in loc if p != "body"]
    if parts and parts[0] in UNION_TAGS:
        parts = parts[1:]  # which form of the body was meant, not a field
    names: list[str] = []
    for part in parts:
        if part.isdigit() or (part.isidentifier() and not (names and part in _TYPE_NAMES)):
            names.append(part)
    return ".".join(names)


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "any"})


def _plain(msg: str) -> str:
    return msg.removeprefix("Input should be ").removeprefix("Value error, ")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A readable message and the offending field for a body that failed validation:
    one clause per field, with the forms a union accepts joined by "or"."""
    by_field: dict[str, list[str]] = {}
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "")
            return f"malformed JSON body: {detail or error.get('msg')}", None
        field = _field_of(tuple(error.get("loc", ())))
        if error.get("type") in ("model_type", "model_attributes_type", "dict_type") and not field:
            return "the request body must be a JSON object", None
        msg = str(error.get("msg", "invalid value"))
        wanted = by_field.setdefault(field, [])
        if msg not in wanted:
            wanted.append(msg)
    parts = []
    for field, msgs in by_field.items():
        if len(msgs) > 1 and all(m.startswith("Input should be ") for m in msgs):
            text = "Input should be " + " or ".join(_plain(m) for m in msgs)
        else:
            text = "; ".join(msgs)
        parts.append(f"{field or 'body'}: {text}")
    param = next((f for f in by_field if f), None)
    return "; ".join(parts) or "invalid request body", param


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work``; cancel it (aborting its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done():
        return task.result()
    # The client left first: let the cancellation run to its end (it aborts the engine
    # requests); a cancelled task has no result to read until then.
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
    logger.info("client disconnected from %s; its request was aborted", request.url.path)
    return Response(status_code=499)  # nobody is listening; the status is for logs


def _respond(result: Any) -> Response:
    if isinstance(result, Response):
        return result
    if hasattr(result, "__aiter__"):
        return StreamingResponse(result, media_type="text/event-stream")
    return JSONResponse(result.model_dump(mode="json"))


def add_exception_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body (a body that fails validation: 400, not 422)."""

    @app.exception_handler(OpenAIServingError)
    async def _serving_error(request: Request, exc: OpenAIServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type", "")
        if content_type and not _is_json(content_type):
            return error_response(
                OpenAIServingError(
                    f"the request body was sent as {content_type.split(';')[0]!r}; send it "
                    "as JSON with the header 'Content-Type: application/json'"
                )
            )
        message, param = _validation_message(exc)
        return error_response(OpenAIServingError(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = HTTPStatus(exc.status_code)
        # Keeps the headers the status needs (Allow on a 405, for one).
        return error_response(OpenAIServingError(str(exc.detail), status), exc.headers)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s", request.url.path)
        return error_response(OpenAIServingError.from_exception(exc))


def add_info_routes(
    app: FastAPI,
    engine: AsyncLLM,
    models: OpenAIServingModels,
    stat_logger: PrometheusStatLogger | None,
) -> None:
    """/health, /version, /metrics and /v1/models."""

    @app.get(
        "/health",
        response_class=Response,
        responses={
            200: {"description": "The engine is up (empty body)"},
            503: {"description": "The engine has stopped (empty body)"},
        },
    )
    async def health() -> Response:
        status = HTTPStatus.SERVICE_UNAVAILABLE if engine.errored else HTTPStatus.OK
        return Response(status_code=int(status))

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"description": "Prometheus metrics", "content": {"text/plain": {}}}},
    )
    async def metrics() -> Response:
        body = stat_logger.render() if stat_logger is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=documented_errors(401))
    async def show_models() -> JSONResponse:
        return JSONResponse(models.show_available_models().model_dump(mode="json"))


def generation_handler(
    work: Callable[[Any], Awaitable[Any]],
) -> Callable[[Any, Request], Awaitable[Response]]:
    """A generation route's body: run ``work`` unless the client leaves, answer with
    JSON, a stream or an error body."""

    async def handle(body: Any, raw_request: Request) -> Response:
        try:
            result = await _unless_disconnected(raw_request, work(body))
        except (OpenAIServingError, ValueError) as exc:
            return error_response(OpenAIServingError.from_exception(exc))
        return _respond(result)

    return handle


def add_generation_routes(app: FastAPI, handlers: Handlers) -> None:
    """/v1/completions and /v1/chat/completions."""
    complete = generation_handler(handlers.completion.create_completion)
    chat_complete = generation_handler(handlers.chat.create_chat_completion)

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses={200: {"content": SSE_CONTENT}, **GENERATION_ERRORS},
    )
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
        return await complete(request, raw_request)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses={200: {"content": SSE_CONTENT}, **GENERATION_ERRORS},
    )
    async def create_chat_completion(
        request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        return await chat_complete(request, raw_request)


def add_tokenizer_routes(app: FastAPI, tokenization: OpenAIServingTokenization) -> None:
    """/tokenize and /detokenize."""

    @app.post(
        "/tokenize",
        response_model=TokenizeResponse,
        responses=documented_errors(400, 401, 404, 413),
    )
    async def tokenize(request: TokenizeRequest) -> JSONResponse:
        result = await tokenization.tokenize(request)
        return JSONResponse(result.model_dump(mode="json"))

    @app.post(
        "/detokenize",
        response_model=DetokenizeResponse,
        responses=documented_errors(400, 401, 404, 413),
    )
    async def detokenize(request: DetokenizeRequest) -> JSONResponse:
        result = await tokenization.detokenize(request)
        return JSONResponse(result.model_dump(mode="json"))
