"""The FastAPI app of the OpenAI-compatible server, and `run_server` (uvicorn).

`build_app` wires the handlers of the ``serving_*`` modules to routes and turns
every failure into OpenAI's error body ``{"error": {message, type, param, code}}``:
a malformed or wrongly typed body is a 400 (FastAPI's 422 is overridden), an
unknown model a 404, a missing or wrong API key a 401 (with ``WWW-Authenticate:
Bearer``), a body larger than ``max_request_body_bytes`` a 413.  The OpenAPI
document at /openapi.json lists exactly these answers.

With an API key, every route needs it except `server_utils.OPEN_PATHS` (health, version,
metrics and the API docs); that includes /tokenize and /detokenize, which vLLM
leaves open, because they run the tokenizer and chat template on any input.

Shutdown (SIGTERM or Ctrl-C): uvicorn stops accepting connections while the engine
stops accepting requests; running requests may finish for ``shutdown_timeout``
seconds, after which the engine aborts them (their streams end with
finish_reason "abort") and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm import __version__
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.stat_logger import LoggingStatLogger
from minivllm.entrypoints.openai.http_protocol import HttpLimits, guarded_protocol
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
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    GENERATION_ERRORS,
    SSE_CONTENT,
    APIKeyMiddleware,
    BodySizeLimitMiddleware,
    RequestIdMiddleware,
    ServerLimits,
    documented_errors,
    error_response,
    openapi_schema,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError, TokenizerPool
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from minivllm.logger import init_logger

logger = init_logger(__name__)


@dataclasses.dataclass
class CORSSettings:
    """CORS answers (vLLM's --allowed-origins, --allowed-methods, --allowed-headers and
    --allow-credentials; by default any origin may call, without credentials)."""

    allowed_origins: list[str] = dataclasses.field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = dataclasses.field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = dataclasses.field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


SHUTDOWN_GRACE_S = 5.0
"""Extra seconds uvicorn waits after shutdown_timeout for aborted streams to close."""


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


def build_app(
    engine: AsyncLLM,
    served_model_names: list[str] | None = None,
    api_key: str | None = None,
    max_log_len: int | None = None,
    stat_logger: PrometheusStatLogger | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    trust_request_chat_template: bool = False,
    enable_log_requests: bool = False,
    cors: CORSSettings | None = None,
    enable_auto_tool_choice: bool = False,
    tool_call_parser: str | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` (``stat_logger`` backs ``/metrics``)."""
    mc = engine.model_config
    names = served_model_names or [mc.served_model_name]
    models = OpenAIServingModels(names, mc.max_model_len)
    # The API thread gets its own tokenizer so it never shares one with the engine thread.
    try:
        tokenizer = copy.deepcopy(engine.get_tokenizer())
    except Exception:  # pragma: no cover - a tokenizer that cannot be copied is shared
        tokenizer = engine.get_tokenizer()
    pool = TokenizerPool(tokenizer)
    common: dict[str, Any] = {
        "max_log_len": max_log_len,
        "pool": pool,
        "enable_log_requests": enable_log_requests,
    }
    trust = {"trust_request_chat_template": trust_request_chat_template}
    completion = OpenAIServingCompletion(engine, models, tokenizer, **common)
    tools = {"enable_auto_tools": enable_auto_tool_choice, "tool_parser": tool_call_parser}
    chat = OpenAIServingChat(engine, models, tokenizer, **common, **trust, **tools)
    tokenization = OpenAIServingTokenization(engine, models, tokenizer, **common, **trust)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown()
        timeout = float(engine.vllm_config.shutdown_timeout)
        await asyncio.to_thread(engine.shutdown, timeout)

    app = FastAPI(title="minivllm OpenAI-compatible API", version=__version__, lifespan=lifespan)
    app.state.engine = engine
    app.state.stat_logger = stat_logger
    # The last middleware added runs first: the key is checked before any body is read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    # Outermost: a CORS preflight is answered before the key check, and every answer
    # (a 401 or a 413 included) carries its X-Request-Id.
    cors = cors or CORSSettings()
    app.add_middleware(
        CORSMiddleware,
        allow_origins=cors.allowed_origins,
        allow_credentials=cors.allow_credentials,
        allow_methods=cors.allowed_methods,
        allow_headers=cors.allowed_headers,
        expose_headers=["X-Request-Id"],
    )
    app.add_middleware(RequestIdMiddleware)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_schema(app, limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    limits = ServerLimits(
        vocab_size=mc.get_vocab_size(),
        max_model_len=mc.max_model_len,
        max_logprobs=mc.max_logprobs,
    )

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

    def _handler(
        work: Callable[[Any], Awaitable[Any]],
    ) -> Callable[[Any, Request], Awaitable[Response]]:
        async def handle(body: Any, raw_request: Request) -> Response:
            try:
                result = await _unless_disconnected(raw_request, work(body))
            except (OpenAIServingError, ValueError) as exc:
                return error_response(OpenAIServingError.from_exception(exc))
            return _respond(result)

        return handle

    complete = _handler(completion.create_completion)
    chat_complete = _handler(chat.create_chat_completion)

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

    return app


def config_summary(
    engine: AsyncLLM,
    host: str,
    port: int,
    api_key: str | None,
    served_names: list[str] | None = None,
) -> str:
    """The start-up banner: the resolved settings that matter for serving, and the URL."""
    cfg = engine.vllm_config
    mc, cc, sc = cfg.model_config, cfg.cache_config, cfg.scheduler_config
    num_blocks = engine.engine.scheduler.kv_cache_manager.block_pool.num_blocks
    rows = {
        "model": mc.model,
        "served model name": ", ".join(served_names or [mc.served_model_name]),
        "dtype": str(mc.dtype).replace("torch.", ""),
        "max_model_len": mc.max_model_len,
        "KV cache": f"{num_blocks} blocks x {cc.block_size} tokens",
        "prefix caching": cc.enable_prefix_caching,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "chunked prefill": sc.enable_chunked_prefill,
        "optimization level": cfg.optimization_level.name,
        "compilation mode": cfg.compilation_config.mode.name,
        "device": cfg.device_config.device_type,
        "shutdown_timeout": f"{cfg.shutdown_timeout} s",
        "API key": "required" if api_key else "not required",
    }
    width = max(len(k) for k in rows)
    lines = [f"minivllm {__version__} OpenAI-compatible server"]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows.items()]
    url = f"http://{host}:{port}"
    lines.append(f"Serving on {url}  (OpenAI base_url: {url}/v1, ready when {url}/health is 200)")
    return "\n".join(lines)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, taken before the model loads so that a busy
    port fails in a second with one clear line, not after the model has loaded."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server "
            "running there?); stop it or choose another --port"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _served_names(args: argparse.Namespace) -> list[str] | None:
    names = getattr(args, "served_model_name", None)
    if not names:
        return None
    return [names] if isinstance(names, str) else list(names)


def run_server(args: argparse.Namespace) -> int:
    """Bind the port, load the engine, print the configuration summary and serve until
    SIGTERM/SIGINT; 0 once a SIGTERM's drain is done."""
    import time

    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.entrypoints.model_tag import engine_args_from_cli

    sock = bind_socket(args.host, args.port)
    start = time.perf_counter()
    vllm_config = engine_args_from_cli(args).create_engine_config()
    mc = vllm_config.model_config
    names = _served_names(args)
    registry = CollectorRegistry()
    stat_logger = PrometheusStatLogger(
        mc.served_model_name, mc.max_model_len, registry, vllm_config.num_speculative_tokens
    )
    stat_loggers: list[Any] = [stat_logger]
    if not vllm_config.logging_config.disable_log_stats:
        stat_loggers.append(LoggingStatLogger(vllm_config.logging_config.log_stats_interval_s))
    engine = AsyncLLM(LLMEngine(vllm_config), stat_loggers=stat_loggers)
    stat_logger.log_cache_config(vllm_config.cache_config)
    cors = CORSSettings(
        allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
    )
    app = build_app(
        engine,
        served_model_names=names,
        api_key=args.api_key,
        max_log_len=args.max_log_len,
        stat_logger=stat_logger,
        max_request_body_bytes=args.max_request_body_bytes,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_log_requests=args.enable_log_requests,
        cors=cors,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
    )
    print(config_summary(engine, args.host, args.port, args.api_key, names), flush=True)
    logger.info("ready in %.1f s: serving on http://%s:%d", time.perf_counter() - start,
                args.host, args.port)  # fmt: skip

    timeout = float(vllm_config.shutdown_timeout)
    limits = HttpLimits(
        header_timeout_s=args.timeout_request_header,
        body_timeout_s=args.timeout_request_body,
        max_body_bytes=args.max_request_body_bytes,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=timeout + SHUTDOWN_GRACE_S,
        timeout_keep_alive=args.timeout_keep_alive,
        http=guarded_protocol(limits),
    )
    server = _Server(config, on_exit=lambda: engine.begin_shutdown(timeout))
    server.run(sockets=[sock])
    return 0


class _Server(uvicorn.Server):
    """uvicorn's Server that also tells the engine to drain when a signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            # uvicorn re-raises the signals it caught once it has stopped, which would
            # end the process with -15 (143) after a clean drain; SIGTERM is how a
            # supervisor asks for a normal stop, so the drain ends with status 0.
            with contextlib.suppress(ValueError):
                self._captured_signals.remove(sig)


__all__ = ["CORSSettings", "bind_socket", "build_app", "config_summary", "run_server"]
