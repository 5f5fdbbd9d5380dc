"""What every OpenAI endpoint handler shares: the engine, the model check, errors,
prompt tokenization and request logging.

Handlers raise `OpenAIServingError`; `api_server` turns it into the JSON error
body.  A ValueError from the engine's validation (bad sampling values, a prompt
that does not fit the context) becomes a 400 whose ``param`` names the field when
the message starts with it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from minivllm.engine.async_llm import AsyncLLM, EngineDeadError, EngineError, EngineShutdownError
from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, StreamOptions, UsageInfo
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.logger import init_logger
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = init_logger(__name__)

_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
}
_PARAM_NAMES = {
    "n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
    "prompt_logprobs", "logit_bias", "allowed_token_ids", "stop_token_ids", "top_logprobs",
}  # fmt: skip
"""Request fields a validation message may start with (reported as the error's param)."""


class OpenAIServingError(Exception):
    """An error answer: HTTP status, message, OpenAI error type and offending param."""

    def __init__(
        self,
        message: str,
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        err_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type or _ERROR_TYPES.get(status, "BadRequestError")
        self.param = param

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(
                message=self.message, type=self.err_type, param=self.param, code=int(self.status)
            )
        )

    @classmethod
    def from_exception(cls, exc: BaseException) -> OpenAIServingError:
        """Map engine-side exceptions to their HTTP answers."""
        if isinstance(exc, OpenAIServingError):
            return exc
        if isinstance(exc, EngineShutdownError):
            return cls(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
        if isinstance(exc, (EngineDeadError, EngineError)):
            return cls(str(exc), HTTPStatus.INTERNAL_SERVER_ERROR)
        if isinstance(exc, ValueError):
            message = str(exc)
            return cls(message, HTTPStatus.BAD_REQUEST, param=_param_of(message))
        return cls(f"internal error: {exc!r}", HTTPStatus.INTERNAL_SERVER_ERROR)


def _param_of(message: str) -> str | None:
    match = re.match(r"(?:Requested )?([a-z_]+)", message)
    if match and match.group(1) in _PARAM_NAMES:
        return match.group(1)
    if "maximum context length" in message:
        return "max_tokens" if "max_tokens" in message else "prompt"
    return None


class OpenAIServing:
    """Base of the endpoint handlers."""

    def __init__(
        self,
        engine: AsyncLLM,
        models: OpenAIServingModels,
        tokenizer: Any,
        max_log_len: int | None = None,
    ) -> None:
        self.engine = engine
        self.models = models
        # The API thread's own tokenizer copy: the engine thread detokenizes with its own.
        self.tokenizer = tokenizer
        self.max_log_len = max_log_len
        self.max_model_len: int = engine.model_config.max_model_len

    def check_model(self, name: str | None) -> str:
        """The served name to answer with; 404 for a model this server does not serve."""
        if name is None or self.models.is_served(name):
            return self.models.model_name(name)
        raise OpenAIServingError(
            f"The model `{name}` does not exist. This server serves: "
            f"{', '.join(self.models.served_names)}.",
            HTTPStatus.NOT_FOUND,
            param="model",
        )

    def make_params(self, request: Any) -> SamplingParams:
        try:
            return request.to_sampling_params()
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            self.engine.validate_request(prompt_ids, params)
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def log_request(
        self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams
    ) -> None:
        limit = self.max_log_len
        shown_prompt = prompt[:limit] if prompt is not None and limit is not None else prompt
        shown_ids = prompt_ids[:limit] if limit is not None else prompt_ids
        logger.info(
            "Received request %s: prompt: %r, params: %r, prompt_token_ids: %s",
            request_id,
            shown_prompt,
            params,
            shown_ids,
        )

    async def iterate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, priority: int
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one prompt."""
        async for output in self.engine.generate(
            {"prompt_token_ids": prompt_ids}, params, request_id, priority=priority
        ):
            yield output


def usage_of(num_prompt_tokens: int, num_completion_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
    )


def sse(chunk: BaseModel | dict[str, Any]) -> str:
    """One server-sent event carrying ``chunk`` as JSON."""
    if isinstance(chunk, BaseModel):
        body = chunk.model_dump_json(exclude_unset=True)
    else:
        body = json.dumps(chunk)
    return f"data: {body}\n\n"


SSE_DONE = "data: [DONE]\n\n"
"""The event that ends every stream."""


def stream_usage_options(opts: StreamOptions | None) -> tuple[bool, bool]:
    """``(include_usage, continuous_usage_stats)`` of a request's ``stream_options``.

    Continuous stats only count when usage is included at all.
    """
    include_usage = bool(opts and opts.include_usage)
    return include_usage, bool(include_usage and opts and opts.continuous_usage_stats)


def sse_usage(
    chunk_cls: type[BaseModel], request_id: str, created: int, model: str, usage: UsageInfo
) -> str:
    """A stream's closing usage event: a ``chunk_cls`` chunk with no choices."""
    return sse(chunk_cls(id=request_id, created=created, model=model, choices=[], usage=usage))


def sse_error(exc: BaseException) -> str:
    """An error in the middle of a stream (the HTTP status is already sent)."""
    return sse(OpenAIServingError.from_exception(exc).to_response())


async def merge_async_iterators(
    *iterators: AsyncIterator[Any],
) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators, yielding ``(which, item)`` as items arrive.

    Leaving early (or an error in one) cancels the rest, so their requests are aborted.
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    done = object()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, iterator: AsyncIterator[Any]) -> None:
        try:
            async for item in iterator:
                await queue.put((index, item))
            await queue.put((index, done))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            await queue.put((index, exc))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def clamp_logprob(value: float) -> float:
    """JSON has no -inf; like vLLM, report impossible tokens as -9999."""
    return max(value, -9999.0)
