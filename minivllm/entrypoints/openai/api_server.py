"""The FastAPI app of the OpenAI-compatible server, and `run_server` (uvicorn).

`build_app` builds the app in named steps: the handlers of the ``serving_*``
modules, the middlewares (a missing or wrong API key is a 401 with
``WWW-Authenticate: Bearer``, a body larger than ``max_request_body_bytes`` a 413),
the OpenAPI document (/openapi.json lists exactly the answers given), then the
exception handlers and routes of `routes`, which turn every failure into OpenAI's
error body.  `run_server` serves it with uvicorn's h11 connections guarded against
slow clients (`http_protocol`).

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
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CollectorRegistry

from minivllm import __version__
from minivllm.engine.async_llm import AsyncLLM
from minivllm.entrypoints.openai.anthropic.routes import (
    AnthropicErrorMiddleware,
    add_messages_routes,
)
from minivllm.entrypoints.openai.anthropic.serving import AnthropicServingMessages
from minivllm.entrypoints.openai.dp_server import (
    data_parallel_summary,
    serve_worker_node,
    start_async_engine,
)
from minivllm.entrypoints.openai.http_protocol import HttpLimits, guarded_protocol
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.entrypoints.openai.responses.routes import add_responses_routes
from minivllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from minivllm.entrypoints.openai.responses.store import ResponseStore, StoreLimits, store_limits_of
from minivllm.entrypoints.openai.routes import (
    Handlers,
    add_exception_handlers,
    add_generation_routes,
    add_info_routes,
    add_tokenizer_routes,
)
from minivllm.entrypoints.openai.routes_pooling import add_pooling_routes
from minivllm.entrypoints.openai.server_utils import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    APIKeyMiddleware,
    BodySizeLimitMiddleware,
    RequestIdMiddleware,
    ServerLimits,
    openapi_schema,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_engine import TokenizerPool
from minivllm.entrypoints.openai.serving_lora import (
    LoRAModulePath,
    add_lora_routes,
    add_static_loras,
)
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
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
    responses_store: StoreLimits | None = None,
    lora_modules: list[LoRAModulePath] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` (``stat_logger`` backs ``/metrics``)."""
    model_config = engine.model_config
    models = OpenAIServingModels(
        served_model_names or [model_config.served_model_name], model_config.max_model_len
    )
    add_static_loras(models, engine, lora_modules or [])
    pool, handlers = _make_handlers(
        engine,
        models,
        {"max_log_len": max_log_len, "enable_log_requests": enable_log_requests},
        {"trust_request_chat_template": trust_request_chat_template},
        {"enable_auto_tools": enable_auto_tool_choice, "tool_parser": tool_call_parser},
        ResponseStore(responses_store or StoreLimits()),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown()
        timeout = float(engine.vllm_config.shutdown_timeout)
        await asyncio.to_thread(engine.shutdown, timeout)

    app = FastAPI(title="minivllm OpenAI-compatible API", version=__version__, lifespan=lifespan)
    app.state.engine = engine
    app.state.stat_logger = stat_logger
    _add_middlewares(app, api_key, max_request_body_bytes, cors or CORSSettings())
    _use_server_openapi(app, engine)
    add_exception_handlers(app)
    add_info_routes(app, engine, models, stat_logger)
    add_generation_routes(app, handlers)
    add_tokenizer_routes(app, handlers.tokenization)
    add_responses_routes(app, handlers.responses)
    add_messages_routes(app, handlers.messages)
    tokenizer, logs = handlers.tokenization.tokenizer, handlers.tokenization
    pooling = OpenAIServingPooling(
        engine, models, tokenizer, logs.max_log_len, pool, logs.enable_log_requests
    )
    add_pooling_routes(app, pooling)
    add_lora_routes(app, models, engine)
    return app


def _make_handlers(
    engine: AsyncLLM,
    models: OpenAIServingModels,
    common: dict[str, Any],
    trust: dict[str, Any],
    tools: dict[str, Any],
    store: ResponseStore,
) -> tuple[TokenizerPool, Handlers]:
    """The endpoint handlers, sharing one tokenizer pool (returned for shutdown)."""
    # The API thread gets its own tokenizer so it never shares one with the engine thread.
    try:
        tokenizer = copy.deepcopy(engine.get_tokenizer())
    except Exception:  # pragma: no cover - a tokenizer that cannot be copied is shared
        tokenizer = engine.get_tokenizer()
    pool = TokenizerPool(tokenizer)
    common = {**common, "pool": pool}
    chat = OpenAIServingChat(engine, models, tokenizer, **common, **trust, **tools)
    return pool, Handlers(
        models=models,
        completion=OpenAIServingCompletion(engine, models, tokenizer, **common),
        chat=chat,
        tokenization=OpenAIServingTokenization(engine, models, tokenizer, **common, **trust),
        responses=OpenAIServingResponses(chat, store),
        messages=AnthropicServingMessages(chat),
    )


def _add_middlewares(app: FastAPI, api_key: str | None, max_body: int, cors: CORSSettings) -> None:
    # The last middleware added runs first: the key is checked before any body is read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    app.add_middleware(AnthropicErrorMiddleware)  # sees the 401s and 413s too
    # Outermost: a CORS preflight is answered before the key check, and every answer
    # (a 401 or a 413 included) carries its X-Request-Id.
    app.add_middleware(
        CORSMiddleware,
        allow_origins=cors.allowed_origins,
        allow_credentials=cors.allow_credentials,
        allow_methods=cors.allowed_methods,
        allow_headers=cors.allowed_headers,
        expose_headers=["X-Request-Id"],
    )
    app.add_middleware(RequestIdMiddleware)


def _use_server_openapi(app: FastAPI, engine: AsyncLLM) -> None:
    """/openapi.json: FastAPI's document with this server's answers and value ranges."""
    model_config = engine.model_config
    limits = ServerLimits(
        vocab_size=model_config.get_vocab_size(),
        max_model_len=model_config.max_model_len,
        max_logprobs=model_config.max_logprobs,
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_schema(app, limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def config_summary(
    engine: AsyncLLM,
    host: str,
    port: int,
    api_key: str | None,
    served_names: list[str] | None = None,
) -> str:
    """The start-up banner: the resolved settings that matter for serving, and the URL."""
    cfg = engine.vllm_config
    model_config, cache_config, scheduler_config = (
        cfg.model_config,
        cfg.cache_config,
        cfg.scheduler_config,
    )
    num_blocks = engine.num_kv_blocks
    rows = {
        "model": model_config.model,
        "served model name": ", ".join(served_names or [model_config.served_model_name]),
        "dtype": str(model_config.dtype).replace("torch.", ""),
        "max_model_len": model_config.max_model_len,
        "KV cache": f"{num_blocks} blocks x {cache_config.block_size} tokens",
        "data parallel": data_parallel_summary(cfg.parallel_config),
        "prefix caching": cache_config.enable_prefix_caching,
        "max_num_seqs": scheduler_config.max_num_seqs,
        "max_num_batched_tokens": scheduler_config.max_num_batched_tokens,
        "chunked prefill": scheduler_config.enable_chunked_prefill,
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

    if getattr(args, "node_rank", 0) > 0:  # a multi-node run's other node: ranks only
        return serve_worker_node(args)
    sock = bind_socket(args.host, args.port)
    start = time.perf_counter()
    engine, stat_logger = _start_engine(args)
    names = _served_names(args)
    app = build_app(
        engine,
        served_model_names=names,
        api_key=args.api_key,
        max_log_len=args.max_log_len,
        stat_logger=stat_logger,
        max_request_body_bytes=args.max_request_body_bytes,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_log_requests=args.enable_log_requests,
        cors=CORSSettings(
            allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods,
            allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
        ),
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        responses_store=store_limits_of(args),
        lora_modules=args.lora_modules,
    )
    print(config_summary(engine, args.host, args.port, args.api_key, names), flush=True)
    logger.info("ready in %.1f s: serving on http://%s:%d", time.perf_counter() - start,
                args.host, args.port)  # fmt: skip
    timeout = float(engine.vllm_config.shutdown_timeout)
    server = _Server(_uvicorn_config(app, args, timeout), lambda: engine.begin_shutdown(timeout))
    server.run(sockets=[sock])
    return 0


def _start_engine(args: argparse.Namespace) -> tuple[AsyncLLM, PrometheusStatLogger]:
    """The engine the flags describe, with its Prometheus (and log) stat loggers."""
    from minivllm.entrypoints.model_tag import engine_args_from_cli

    vllm_config = engine_args_from_cli(args).create_engine_config()
    model_config = vllm_config.model_config
    stat_logger = PrometheusStatLogger(
        model_config.served_model_name,
        model_config.max_model_len,
        CollectorRegistry(),
        vllm_config.num_speculative_tokens,
        vllm_config.lora_config.max_loras if vllm_config.lora_config else 0,
    )
    engine = start_async_engine(vllm_config, stat_logger)
    stat_logger.log_cache_config(vllm_config.cache_config)
    return engine, stat_logger


def _uvicorn_config(app: FastAPI, args: argparse.Namespace, drain_s: float) -> uvicorn.Config:
    """uvicorn's settings: the flags' timeouts, on connections guarded against slow
    clients (`http_protocol`)."""
    limits = HttpLimits(
        header_timeout_s=args.timeout_request_header,
        body_timeout_s=args.timeout_request_body,
        max_body_bytes=args.max_request_body_bytes,
    )
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=drain_s + SHUTDOWN_GRACE_S,
        timeout_keep_alive=args.timeout_keep_alive,
        http=guarded_protocol(limits),
    )


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
