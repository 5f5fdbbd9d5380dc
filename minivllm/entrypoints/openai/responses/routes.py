"""The routes of the Responses API: create, retrieve and cancel."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from minivllm.entrypoints.openai.protocol import ErrorResponse
from minivllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from minivllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from minivllm.entrypoints.openai.routes import generation_handler
from minivllm.entrypoints.openai.server_utils import (
    GENERATION_ERRORS,
    SSE_CONTENT,
    documented_errors,
)

_NOT_STORED = {
    404: {
        "model": ErrorResponse,
        "description": "No stored response has this id (never stored, or evicted)",
    }
}


def add_responses_routes(app: FastAPI, responses: OpenAIServingResponses) -> None:
    """/v1/responses, GET /v1/responses/{response_id} and POST .../cancel."""
    create = generation_handler(responses.create_response)

    @app.post(
        "/v1/responses",
        response_model=ResponsesResponse,
        responses={200: {"content": SSE_CONTENT}, **GENERATION_ERRORS},
    )
    async def create_response(request: ResponsesRequest, raw_request: Request) -> Response:
        return await create(request, raw_request)

    @app.get(
        "/v1/responses/{response_id}",
        response_model=ResponsesResponse,
        responses={**documented_errors(401), **_NOT_STORED},
    )
    async def retrieve_response(response_id: str) -> JSONResponse:
        return _json(responses.retrieve(response_id))

    @app.post(
        "/v1/responses/{response_id}/cancel",
        response_model=ResponsesResponse,
        responses={**documented_errors(400, 401), **_NOT_STORED},
    )
    async def cancel_response(response_id: str) -> JSONResponse:
        return _json(responses.cancel(response_id))


def _json(body: Any) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"))
