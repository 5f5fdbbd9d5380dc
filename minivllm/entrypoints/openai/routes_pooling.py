"""The pooling routes, vLLM's paths: /v1/embeddings, /pooling, /classify, /score,
/rerank (each also under /v1/, rerank under /v2/ too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from minivllm.entrypoints.openai.protocol_pooling import (
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingRequest,
    PoolingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from minivllm.entrypoints.openai.routes import generation_handler
from minivllm.entrypoints.openai.server_utils import documented_errors
from minivllm.entrypoints.openai.serving_pooling import OpenAIServingPooling

ERRORS = documented_errors(400, 401, 404, 413)


def _post(
    app: FastAPI, paths: list[str], body: type, response: type, work: Callable[[Any], Any]
) -> None:
    handle = generation_handler(work)

    async def route(request: Any, raw_request: Request) -> Response:
        return await handle(request, raw_request)

    route.__annotations__["request"] = body
    for path in paths:
        app.post(path, response_model=response, responses=ERRORS)(route)


def add_pooling_routes(app: FastAPI, pooling: OpenAIServingPooling) -> None:
    """The pooling endpoints (a generation model answers them with a 400)."""
    _post(app, ["/v1/embeddings"], EmbeddingRequest, EmbeddingResponse, pooling.create_embedding)
    _post(app, ["/pooling", "/v1/pooling"], PoolingRequest, PoolingResponse, pooling.create_pooling)
    _post(
        app,
        ["/classify", "/v1/classify"],
        ClassificationRequest,
        ClassificationResponse,
        pooling.create_classify,
    )
    _post(app, ["/score", "/v1/score"], ScoreRequest, ScoreResponse, pooling.create_score)
    _post(
        app,
        ["/rerank", "/v1/rerank", "/v2/rerank"],
        RerankRequest,
        RerankResponse,
        pooling.create_rerank,
    )
