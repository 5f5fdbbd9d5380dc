"""What every OpenAI endpoint handler shares: the engine, the model check, errors,
prompt tokenization and request logging.

Handlers raise `OpenAIServingError`; `api_server` turns it into the JSON error
body.  A ValueError from the engine's validation (bad sampling values, a prompt
that does not fit the context) becomes a 400 whose ``param`` names the field when
the message starts with it.

Tokenization, chat-template rendering and detokenization of whole prompts run in
`TokenizerPool` threads, never on the event loop: a huge prompt or a slow template
delays only its own request, while /health and the token streams of others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, TypeVar

from pydantic import BaseModel

from minivllm.engine.async_llm import (
    AsyncLLM,
    EngineDeadError,
    EngineError,
    EngineShutdownError,
    RequestConstraintError,
)
from minivllm.engine.input_processor import ValidatedRequest
from minivllm.entrypoints.openai.protocol import (
    ErrorInfo,
    ErrorResponse,
    PromptLogprob,
    PromptLogprobs,
    UsageInfo,
    unknown_fields,
)
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.logger import init_logger
from minivllm.outputs import RequestOutput
from minivllm.reasoning import ReasoningParser
from minivllm.sampling_params import SamplingParams

logger = init_logger(__name__)
T = TypeVar("T")

_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.METHOD_NOT_ALLOWED: "MethodNotAllowedError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RequestTooLargeError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
}
# Request fields a validation message may start with (reported as the error's param).
_PARAM_NAMES = {
    "n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
    "prompt_logprobs", "logit_bias", "allowed_token_ids", "stop_token_ids", "top_logprobs",
    "priority",
}  # fmt: skip

TOKENIZER_THREADS = 2
"""Threads that tokenize and render prompts (each with its own tokenizer copy)."""
MAX_LOGGED_UNKNOWN_FIELDS = 10
"""The most unknown request fields one warning names (the rest are only counted)."""
MAX_LOGGED_FIELD_NAME = 64
"""Characters of an unknown field's name a warning shows."""


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
        if isinstance(exc, RequestConstraintError):
            return cls(str(exc), HTTPStatus.BAD_REQUEST)
        if isinstance(exc, (EngineDeadError, EngineError)):
            return cls(str(exc), HTTPStatus.INTERNAL_SERVER_ERROR)
        if isinstance(exc, ValueError):
            message = str(exc)
            return cls(message, HTTPStatus.BAD_REQUEST, param=_param_of(message))
        return cls(f"internal error: {exc!r}", HTTPStatus.INTERNAL_SERVER_ERROR)


class TokenizerPool:
    """Runs tokenizer work (encode, chat templates, decode) in worker threads.

    A fast tokenizer is not safe to use from two threads at once, so every thread
    works on its own deep copy of ``tokenizer``, made the first time it is needed.
    """

    def __init__(self, tokenizer: Any, num_threads: int = TOKENIZER_THREADS) -> None:
        self._base = tokenizer
        self._copy_lock = threading.Lock()
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="minivllm-tokenize")

    def _tokenizer(self) -> Any:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._copy_lock:
                try:
                    tokenizer = copy.deepcopy(self._base)
                except Exception:  # pragma: no cover - an uncopyable tokenizer is shared
                    tokenizer = self._base
            self._local.tokenizer = tokenizer
        return tokenizer

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(tokenizer, *args)`` in a pool thread, awaited without blocking the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._tokenizer(), *args))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def engine_request_id(display_id: str) -> str:
    """The id the engine runs a request under: the client's (or the response's) id made
    unique, so that a client reusing an id can never abort or collide with another."""
    return f"{display_id}-{uuid.uuid4().hex[:16]}"


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
        pool: TokenizerPool | None = None,
        enable_log_requests: bool = False,
    ) -> None:
        self.engine = engine
        self.models = models
        # The event loop's own tokenizer copy (the engine thread detokenizes with its own):
        # only for single tokens; whole prompts go through the pool.
        self.tokenizer = tokenizer
        self.pool = pool or TokenizerPool(tokenizer)
        self.max_log_len = max_log_len
        self.enable_log_requests = enable_log_requests
        self.max_model_len: int = engine.model_config.max_model_len

    def reasoning_parser(
        self, chat_template_kwargs: dict[str, Any] | None = None
    ) -> ReasoningParser | None:
        """A fresh reasoning parser for one generated text, or None without
        --reasoning-parser (see `minivllm.reasoning`)."""
        reasoning = self.engine.vllm_config.reasoning_config
        return None if reasoning is None else reasoning.new_parser(chat_template_kwargs)

    def check_model(self, name: str | None) -> str:
        """The served name to answer with; 404 for a model this server does not serve."""
        if name is None or self.models.is_served(name):
            return self.models.model_name(name)
        raise OpenAIServingError(
            f"The model `{name}` does not exist. This server serves: "
            f"{', '.join(self.models.all_names)}.",
            HTTPStatus.NOT_FOUND,
            param="model",
        )

    def warn_unknown_fields(self, request: BaseModel) -> None:
        """One bounded warning for the fields of ``request`` this server does not know:
        at most `MAX_LOGGED_UNKNOWN_FIELDS` names, each cut short, the line cut to
        --max-log-len (a body of thousands of 1 KB keys must not write megabytes)."""
        count, names = unknown_fields(request, MAX_LOGGED_UNKNOWN_FIELDS)
        if not count:
            return
        shown = ", ".join(
            name if len(name) <= MAX_LOGGED_FIELD_NAME else name[:MAX_LOGGED_FIELD_NAME] + "..."
            for name in names
        )
        if self.max_log_len is not None and len(shown) > self.max_log_len:
            shown = shown[: self.max_log_len] + "..."
        more = f" (and {count - len(names)} more)" if count > len(names) else ""
        logger.warning(
            "%s: ignoring %d unknown field(s): %s%s", type(request).__name__, count, shown, more
        )

    def make_params(self, request: Any) -> SamplingParams:
        try:
            return request.to_sampling_params()
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None

    async def validate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        model: str | None = None,
    ) -> ValidatedRequest:
        """The engine's validated request (`iterate` sends it), or a 400 for one it
        refuses.  A structured-output request compiles its grammar here, in a worker
        thread: compiling a large schema is CPU work that must not stall the event loop."""
        args = (prompt_ids, params, priority, self.models.lora_for(model))
        try:
            if params.structured_outputs is None:
                return self.engine.process_inputs(*args)
            return await asyncio.to_thread(self.engine.process_inputs, *args)
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None

    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text (tokenized in the pool)."""
        return await self.pool.run(_encode_all, texts, add_special_tokens)

    async def decode(self, token_ids: list[int]) -> str:
        """The text of ``token_ids`` (decoded in the pool)."""
        return await self.pool.run(_decode, token_ids)

    def log_request(
        self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams
    ) -> None:
        """Log a request (its prompt and ids cut to --max-log-len) only when the server
        runs with --enable-log-requests: prompts are the users' data, and a whole one per
        request at INFO drowns the log."""
        if not self.enable_log_requests:
            return
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
        self, request: ValidatedRequest, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one validated prompt (``request_id``: from
        `engine_request_id`)."""
        async for output in self.engine.generate(request, None, request_id):
            yield output


def _encode_all(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    return [list(tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]


def _decode(tokenizer: Any, token_ids: list[int]) -> str:
    return str(tokenizer.decode(token_ids))


async def start_streams(generators: list[AsyncIterator[T]]) -> list[AsyncIterator[T]]:
    """Wait for the first item of every generator before a streaming answer starts, so
    that a request the engine refuses gets its 4xx instead of a 200 and an error event.

    The generators start together (their requests join one engine step); if any fails,
    all are closed (aborting their requests) and the error is raised.
    """
    try:
        results = await asyncio.gather(*(_first(g) for g in generators), return_exceptions=True)
    except BaseException:  # cancelled (the client left): abort whichever already started
        await _close_all(generators)
        raise
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await _close_all(generators)
        raise OpenAIServingError.from_exception(errors[0]) from None
    return [_chain(first, g) for first, g in zip(results, generators, strict=True)]


async def _close_all(generators: list[AsyncIterator[Any]]) -> None:
    for generator in generators:
        with contextlib.suppress(Exception):
            await generator.aclose()  # type: ignore[attr-defined]


_EMPTY = object()


async def _first(generator: AsyncIterator[T]) -> Any:
    try:
        return await generator.__anext__()
    except StopAsyncIteration:
        return _EMPTY


async def _chain(first: Any, generator: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        if first is _EMPTY:
            return
        yield first
        async for item in generator:
            yield item
    finally:
        await generator.aclose()  # type: ignore[attr-defined]


def usage_of(num_prompt_tokens: int, num_completion_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
    )


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


def prompt_logprobs_of(output: RequestOutput) -> PromptLogprobs | None:
    """A response's ``prompt_logprobs``: the engine's, with -inf clamped."""
    if output.prompt_logprobs is None:
        return None
    return [
        None
        if position is None
        else {
            token_id: PromptLogprob(
                logprob=clamp_logprob(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token
            )
            for token_id, lp in position.items()
        }
        for position in output.prompt_logprobs
    ]
