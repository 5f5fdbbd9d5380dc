"""``minivllm disagg-proxy``: disaggregated prefill behind one OpenAI endpoint.

Each completion or chat request goes first to a prefill instance (a ``minivllm
serve`` with a ``kv_producer`` connector) with ``max_tokens=1`` and
``kv_transfer_params={"do_remote_decode": true, ...}``, then to a decode instance
(``kv_consumer``) with the ``kv_transfer_params`` the prefill answered, which tell
it where to pull the prompt's KV from; the decode instance's answer (streamed or
not) is the client's.  Instances are taken round robin.  This is the flow of
vLLM's ``toy_proxy_server.py`` example.
"""

from __future__ import annotations

import argparse
import copy
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="Address the proxy listens on.")
    parser.add_argument("--port", type=int, default=8000, help="Port the proxy listens on.")
    parser.add_argument("--prefiller-hosts", nargs="+", default=["127.0.0.1"])
    parser.add_argument("--prefiller-ports", nargs="+", type=int, default=[8100])
    parser.add_argument("--decoder-hosts", nargs="+", default=["127.0.0.1"])
    parser.add_argument("--decoder-ports", nargs="+", type=int, default=[8200])
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="Seconds to wait for an instance."
    )


def _urls(hosts: list[str], ports: list[int], role: str) -> list[str]:
    if len(hosts) == 1:
        hosts = hosts * len(ports)
    if len(hosts) != len(ports):
        raise ValueError(
            f"--{role}-hosts and --{role}-ports must pair up (got {len(hosts)} hosts and "
            f"{len(ports)} ports); give one host for all ports, or one per port"
        )
    return [f"http://{h}:{p}" for h, p in zip(hosts, ports, strict=True)]


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request the prefill instance gets: one token, no stream, KV kept for decode."""
    req = copy.deepcopy(body)
    req["kv_transfer_params"] = dict(PREFILL_PARAMS)
    req["stream"] = False
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    req.pop("stream_options", None)
    return req


def build_app(prefill_urls: list[str], decode_urls: list[str], timeout: float) -> FastAPI:
    app = FastAPI(title="minivllm disaggregated-prefill proxy")
    prefillers, decoders = itertools.cycle(prefill_urls), itertools.cycle(decode_urls)
    client = httpx.AsyncClient(timeout=timeout)

    async def relay(path: str, request: Request) -> Response:
        try:
            return await forward(path, await request.json())
        except httpx.HTTPError as exc:
            message = f"an instance behind the proxy cannot be reached: {exc!r}"
            error = {"message": message, "type": "BadGateway", "param": None, "code": 502}
            return JSONResponse({"error": error}, 502)

    async def forward(path: str, body: dict[str, Any]) -> Response:
        prefill = await client.post(f"{next(prefillers)}{path}", json=prefill_request(body))
        if prefill.status_code != 200:
            return Response(prefill.content, prefill.status_code, media_type="application/json")
        decode_body = dict(body)
        decode_body["kv_transfer_params"] = prefill.json().get("kv_transfer_params")
        url = f"{next(decoders)}{path}"
        if not body.get("stream"):
            answer = await client.post(url, json=decode_body)
            return Response(answer.content, answer.status_code, media_type="application/json")
        upstream = client.stream("POST", url, json=decode_body)
        answer = await upstream.__aenter__()

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_bytes():
                    yield chunk
            finally:
                await upstream.__aexit__(None, None, None)

        return StreamingResponse(
            chunks(), answer.status_code, media_type=answer.headers.get("content-type")
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await relay("/v1/chat/completions", request)

    @app.get("/health")
    async def health() -> Response:
        for url in [*prefill_urls, *decode_urls]:
            try:
                if (await client.get(f"{url}/health")).status_code != 200:
                    return JSONResponse({"unhealthy": url}, 503)
            except httpx.HTTPError:
                return JSONResponse({"unreachable": url}, 503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await client.get(f"{decode_urls[0]}/v1/models")
        return Response(answer.content, answer.status_code, media_type="application/json")

    return app


def run(args: argparse.Namespace) -> int:
    import uvicorn

    prefill = _urls(args.prefiller_hosts, args.prefiller_ports, "prefiller")
    decode = _urls(args.decoder_hosts, args.decoder_ports, "decoder")
    app = build_app(prefill, decode, args.timeout)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
