"""``minivllm bench serve``: load-test an OpenAI-compatible server (as ``vllm bench serve``).

Requests stream (``"stream": true`` with ``stream_options.include_usage``) from an
asyncio client built on httpx.  They arrive all at once (``--request-rate inf``) or
as a Poisson process (gamma with ``--burstiness`` != 1), at most
``--max-concurrency`` in flight.  Token counts come from the server's usage chunk;
a server that sends none is counted with the tokenizer.  Any server speaking the
OpenAI API works: minivllm's own, vLLM, or another.

Embeddings mode (``--endpoint /v1/embeddings``, a server run with ``--runner
pooling``): each request embeds its prompt (one non-streamed answer, so its time to
first token is its latency and it generates nothing); the figures that matter are
requests/s and input tokens/s ("Total token throughput").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from minivllm import envs
from minivllm.entrypoints.bench.common import (
    add_common_args,
    parse_percentiles,
    print_table,
    write_json,
)
from minivllm.entrypoints.bench.datasets import SampleRequest, add_dataset_args, get_samples
from minivllm.entrypoints.bench.serve_metrics import (
    RequestResult,
    compute_metrics,
    parse_goodput,
    summary_rows,
)
from minivllm.logger import init_logger

logger = init_logger(__name__)

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
"""The endpoints ``--endpoint`` may name."""
DEFAULT_TIMEOUT_S = 6 * 60 * 60
"""Per-request timeout (vLLM's: six hours, so that long runs never time out spuriously)."""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Server, traffic, metric and dataset flags."""
    server = parser.add_argument_group("server")
    server.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="Where the server listens (default http://127.0.0.1:8000, `minivllm serve`'s).",
    )
    server.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    server.add_argument(
        "--model", default=None, help="Model name sent in requests (default: the server's first)."
    )
    server.add_argument(
        "--tokenizer",
        default=None,
        help="Tokenizer (local HF directory or .gguf) for building prompts and for counting "
        "tokens when the server sends no usage (default: --model or the server's model path "
        "when local, else minivllm's default model).",
    )
    server.add_argument(
        "--api-key",
        default=envs.openai_api_key(),
        help="Bearer token sent to the server (default: $OPENAI_API_KEY).",
    )
    traffic = parser.add_argument_group("traffic")
    traffic.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Requests per second; inf (default) sends them all at once, else arrivals are "
        "a Poisson process.",
    )
    traffic.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more uniform.",
    )
    traffic.add_argument(
        "--max-concurrency", type=int, default=None, help="Most requests in flight at once."
    )
    traffic.add_argument(
        "--ignore-eos", action="store_true", help="Ask the server to ignore EOS (vLLM extension)."
    )
    traffic.add_argument("--temperature", type=float, default=0.0, help="Sampling temperature.")
    traffic.add_argument(
        "--request-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="Seconds per request."
    )
    report = parser.add_argument_group("report")
    report.add_argument(
        "--metric-percentiles",
        default="90,99",
        help="Comma-separated percentiles reported besides mean and median (default 90,99).",
    )
    report.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="METRIC:MS",
        help="SLOs in ms (ttft, tpot, e2el), e.g. --goodput ttft:500 tpot:50; a request is "
        "'good' when within all of them.",
    )
    report.add_argument(
        "--plot", default=None, metavar="FILE.png", help="Draw latency CDFs and throughput."
    )
    add_dataset_args(parser)
    add_common_args(parser)


def arrival_offsets(
    num: int, request_rate: float, burstiness: float, rng: random.Random
) -> list[float]:
    """Seconds after the start at which each request is sent."""
    if math.isinf(request_rate):
        return [0.0] * num
    scale = 1.0 / (request_rate * burstiness)
    offsets, now = [], 0.0
    for _ in range(num):
        offsets.append(now)
        now += rng.gammavariate(burstiness, scale)
    return offsets


def build_payload(
    endpoint: str, model: str, sample: SampleRequest, args: argparse.Namespace
) -> dict[str, Any]:
    """The JSON body of one streaming request (one embeddings request)."""
    if endpoint == "/v1/embeddings":
        return {"model": model, "input": sample.prompt, "encoding_format": "base64"}
    payload: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": args.temperature,
    }
    if endpoint == "/v1/chat/completions":
        payload["messages"] = [{"role": "user", "content": sample.prompt}]
        payload["max_completion_tokens"] = sample.expected_output_len
    else:
        payload["prompt"] = sample.prompt
        payload["max_tokens"] = sample.expected_output_len
    if args.ignore_eos:  # only when asked: strict servers reject unknown fields
        payload["ignore_eos"] = True
    return payload


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:  # chat
        delta = choice["delta"] or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send_request(
    client: Any,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    sample: SampleRequest,
    bench_start: float,
    count_tokens: Callable[[str], int],
) -> RequestResult:
    """Stream one request; never raises (a failure is recorded in the result)."""
    result = RequestResult(prompt_len=sample.prompt_len)
    sent = time.perf_counter()
    result.start_time = sent - bench_start
    last = sent
    usage: dict[str, Any] | None = None
    pieces: list[str] = []
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:500]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    result.error = f"stream error: {json.dumps(chunk['error'])[:500]}"
                    return result
                usage = chunk.get("usage") or usage
                text = _chunk_text(chunk)
                if not text:
                    continue
                now = time.perf_counter()
                if not pieces:
                    result.ttft = now - sent
                else:
                    result.itl.append(now - last)
                last = now
                result.chunk_times.append(now - bench_start)
                pieces.append(text)
        result.latency = time.perf_counter() - sent
        if not pieces:  # nothing visible was generated: the first "token" is the end
            result.ttft = result.latency
        result.generated_text = "".join(pieces)
        if usage and usage.get("completion_tokens") is not None:
            result.output_tokens = int(usage["completion_tokens"])
        else:
            result.output_tokens = count_tokens(result.generated_text)
        if usage and usage.get("prompt_tokens") is not None:
            result.prompt_len = int(usage["prompt_tokens"])
        result.success = True
    except Exception as exc:  # a benchmark records failures instead of stopping
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def send_embedding_request(
    client: Any,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    sample: SampleRequest,
    bench_start: float,
) -> RequestResult:
    """One embeddings request (not streamed); never raises."""
    result = RequestResult(prompt_len=sample.prompt_len)
    sent = time.perf_counter()
    result.start_time = sent - bench_start
    try:
        response = await client.post(url, json=payload, headers=headers)
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {response.text[:500]}"
            return result
        usage = response.json().get("usage") or {}
        result.latency = result.ttft = time.perf_counter() - sent
        result.chunk_times.append(result.latency + result.start_time)
        if usage.get("prompt_tokens") is not None:
            result.prompt_len = int(usage["prompt_tokens"])
        result.success = True
    except Exception as exc:  # a benchmark records failures instead of stopping
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_requests(
    make_request: Callable[[int], Awaitable[RequestResult]],
    offsets: list[float],
    max_concurrency: int | None,
    progress: bool,
) -> tuple[list[RequestResult], float]:
    """Start request ``i`` at ``offsets[i]`` (waiting for a free slot); results, duration."""
    from tqdm.auto import tqdm

    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(offsets), desc="Requests", dynamic_ncols=True, disable=not progress)

    async def one(i: int) -> RequestResult:
        if semaphore is None:
            result = await make_request(i)
        else:
            async with semaphore:
                result = await make_request(i)
        bar.update(1)
        return result

    start = time.perf_counter()
    tasks = []
    try:
        for i, offset in enumerate(offsets):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        results = list(await asyncio.gather(*tasks))
    finally:
        bar.close()
    return results, time.perf_counter() - start


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_models(base_url: str, api_key: str | None) -> list[dict[str, Any]]:
    """The server's /v1/models entries; a clear error when it cannot be reached."""
    import httpx

    url = base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, headers=_headers(api_key), timeout=30)
    except httpx.TransportError as exc:
        raise ValueError(
            f"cannot reach the server at {base_url} ({exc}); start one (e.g. `minivllm serve`) "
            "or pass its address with --base-url"
        ) from None
    if response.status_code != 200:
        raise ValueError(
            f"GET {url} answered HTTP {response.status_code}: {response.text[:200]} "
            "(a wrong --api-key, or not an OpenAI-compatible server?)"
        )
    return list(response.json().get("data") or [])


def resolve_tokenizer_source(args: argparse.Namespace, models: list[dict[str, Any]]) -> str:
    """Where the tokenizer is read from (see the --tokenizer help)."""
    from minivllm.transformers_utils.config import default_model_path

    if args.tokenizer is not None:
        return str(args.tokenizer)
    candidates = [args.model] + [m.get("root") for m in models if m.get("id") == args.model]
    for candidate in candidates:
        if candidate and Path(str(candidate)).expanduser().exists():
            return str(candidate)
    logger.info("no local tokenizer for %r; counting with minivllm's default model", args.model)
    return default_model_path()


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark, print the summary, write --output-json (and --plot)."""
    import httpx

    from minivllm.tokenizer import get_tokenizer

    percentiles = parse_percentiles(args.metric_percentiles)
    slos = parse_goodput(args.goodput)
    if not args.request_rate > 0:
        raise ValueError(f"argument --request-rate: must be > 0 (or inf), got {args.request_rate}")
    if not args.burstiness > 0:
        raise ValueError(f"argument --burstiness: must be > 0, got {args.burstiness}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"argument --max-concurrency: must be >= 1, got {args.max_concurrency}")
    if args.plot is not None and not str(args.plot).lower().endswith(".png"):
        raise ValueError(f"argument --plot: the file name must end in .png, got {args.plot!r}")
    if args.plot is not None:
        from minivllm.entrypoints.bench.plot import require_matplotlib

        require_matplotlib()

    models = fetch_models(args.base_url, args.api_key)
    if args.model is None:
        if not models:
            raise ValueError("the server lists no model; pass --model NAME")
        args.model = models[0]["id"]
    tokenizer = get_tokenizer(resolve_tokenizer_source(args, models))
    samples = get_samples(args, tokenizer)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    url = args.base_url.rstrip("/") + args.endpoint
    headers = _headers(args.api_key)
    offsets = arrival_offsets(
        len(samples), args.request_rate, args.burstiness, random.Random(args.seed)
    )
    print(
        f"Traffic: request rate {args.request_rate} req/s, burstiness {args.burstiness}, "
        f"max concurrency {args.max_concurrency}; {len(samples)} requests to {url}"
    )

    async def benchmark() -> tuple[list[RequestResult], float]:
        limit = args.max_concurrency or len(samples)
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        timeout = httpx.Timeout(args.request_timeout, connect=60.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            start = time.perf_counter()

            def make_request(i: int) -> Awaitable[RequestResult]:
                payload = build_payload(args.endpoint, args.model, samples[i], args)
                if args.endpoint == "/v1/embeddings":
                    return send_embedding_request(client, url, payload, headers, samples[i], start)
                return send_request(client, url, payload, headers, samples[i], start, count_tokens)

            results, duration = await run_requests(
                make_request, offsets, args.max_concurrency, not args.disable_tqdm
            )
        return results, duration

    results, duration = asyncio.run(benchmark())
    metrics = compute_metrics(results, duration, percentiles, slos)
    if metrics["completed"] == 0:
        first_error = next((r.error for r in results if r.error), "")
        logger.warning("every request failed; the first error: %s", first_error)
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "model": args.model,
        "num_prompts": len(samples),
        "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "goodput_slos_ms": slos,
        **metrics,
    }
    print_table(
        "Serving Benchmark Result", summary_rows(metrics, percentiles, args.max_concurrency)
    )
    write_json(args.output_json, result)
    if args.plot is not None:
        from minivllm.entrypoints.bench.plot import plot_serve

        plot_serve(results, duration, args.plot)
        print(f"Plot written to {args.plot}")
    return result
