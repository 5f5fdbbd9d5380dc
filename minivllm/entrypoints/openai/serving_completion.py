"""``POST /v1/completions``: one engine request per prompt, ``n`` completions each.

Choice indices follow vLLM: prompt ``p``'s completion ``i`` is choice ``p * n + i``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence

from minivllm.entrypoints.openai.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    random_id,
)
from minivllm.entrypoints.openai.serving_engine import (
    OpenAIServing,
    OpenAIServingError,
    clamp_logprob,
    engine_request_id,
    merge_async_iterators,
    prompt_logprobs_of,
    start_streams,
    usage_of,
)
from minivllm.entrypoints.openai.sse_stream import StreamUsage, framed, sse
from minivllm.outputs import CompletionOutput, Logprob, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    """Handler of the completions endpoint."""

    async def _prompts(self, request: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """``(text or None, token ids)`` for each prompt of the request."""
        prompt = request.prompt
        if isinstance(prompt, str):
            items: list[str | list[int]] = [prompt]
        elif prompt and isinstance(prompt[0], (str, list)):
            items = list(prompt)  # type: ignore[arg-type]
        else:
            items = [prompt]  # type: ignore[list-item]
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(await self.encode(texts, request.add_special_tokens) if texts else [])
        return [
            (item, next(encoded)) if isinstance(item, str) else (None, list(item)) for item in items
        ]

    async def create_completion(
        self, request: CompletionRequest
    ) -> CompletionResponse | AsyncIterator[str]:
        """The response, or the SSE stream when ``stream`` is set (errors before the first
        token raise `OpenAIServingError`)."""
        model = self.check_model(request.model)
        self.warn_unknown_fields(request)
        if request.suffix is not None:
            raise OpenAIServingError("suffix is not supported", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIServingError("best_of must equal n (or be unset)", param="best_of")
        params = self.make_params(request)
        prompts = await self._prompts(request)
        validated = [
            await self.validate(ids, params, request.priority, request.model) for _, ids in prompts
        ]
        request_id = request.request_id or random_id("cmpl")
        engine_id = engine_request_id(request_id)
        generators = []
        for i, ((text, ids), checked) in enumerate(zip(prompts, validated, strict=True)):
            sub_id = f"{engine_id}-{i}"
            self.log_request(sub_id, text, ids, params)
            generators.append(self.iterate(checked, sub_id))
        created = int(time.time())
        if request.stream:
            generators = await start_streams(generators)
            return self._stream(request, request_id, created, model, prompts, generators)
        return await self._full(request, request_id, created, model, prompts, generators)

    def _prompt_text(self, text: str | None, ids: list[int]) -> str:
        return text if text is not None else self.tokenizer.decode(ids)

    async def _full(
        self,
        request: CompletionRequest,
        request_id: str,
        created: int,
        model: str,
        prompts: list[tuple[str | None, list[int]]],
        generators: list[AsyncIterator[RequestOutput]],
    ) -> CompletionResponse:
        finals: dict[int, RequestOutput] = {}
        try:
            async for index, output in merge_async_iterators(*generators):
                finals[index] = output
        except Exception as exc:
            raise OpenAIServingError.from_exception(exc) from None
        choices = []
        num_prompt_tokens = num_completion_tokens = 0
        for p, (text, ids) in enumerate(prompts):
            output = finals[p]
            num_prompt_tokens += len(ids)
            prompt_logprobs = None
            if request.prompt_logprobs is not None:
                prompt_logprobs = prompt_logprobs_of(output)
            for completion in output.outputs:
                num_completion_tokens += len(completion.token_ids)
                out_text, token_ids, logprobs = completion.text, completion.token_ids, None
                prefix_ids: list[int] = []
                prefix_lps: list[dict[int, Logprob] | None] = []
                if request.echo:
                    out_text = self._prompt_text(text, ids) + out_text
                    prefix_ids = ids
                    prefix_lps = list(output.prompt_logprobs or [None] * len(ids))
                if request.logprobs is not None:
                    logprobs = self.legacy_logprobs(
                        [*prefix_ids, *token_ids],
                        [*prefix_lps, *(completion.logprobs or [])],
                        request.logprobs,
                        0,
                    )
                choices.append(
                    CompletionResponseChoice(
                        index=p * request.n + completion.index,
                        text=out_text,
                        logprobs=logprobs,
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        spec_decode_metrics=completion.spec_decode_metrics,
                        prompt_logprobs=prompt_logprobs,
                    )
                )
        choices.sort(key=lambda c: c.index)
        return CompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage_of(num_prompt_tokens, num_completion_tokens),
            kv_transfer_params=finals[0].kv_transfer_params if finals else None,
        )

    def _stream(
        self,
        request: CompletionRequest,
        request_id: str,
        created: int,
        model: str,
        prompts: list[tuple[str | None, list[int]]],
        generators: list[AsyncIterator[RequestOutput]],
    ) -> AsyncIterator[str]:
        num_prompt_tokens = sum(len(ids) for _, ids in prompts)
        usage = StreamUsage.of(request.stream_options, num_prompt_tokens, len(prompts) * request.n)

        async def events() -> AsyncIterator[str]:
            echoed = [False] * len(usage.num_tokens)
            offsets = [0] * len(usage.num_tokens)
            async for p, output in merge_async_iterators(*generators):
                for completion in output.outputs:
                    index = p * request.n + completion.index
                    usage.num_tokens[index] += len(completion.token_ids)
                    choice = self._stream_choice(
                        request, index, prompts[p], output, completion, echoed, offsets
                    )
                    if choice is not None:
                        chunk = CompletionStreamResponse(
                            id=request_id, created=created, model=model, choices=[choice]
                        )
                        yield sse(usage.stamp(chunk))

        return framed(
            events(), lambda: usage.closing(CompletionStreamResponse, request_id, created, model)
        )

    def _stream_choice(
        self,
        request: CompletionRequest,
        index: int,
        prompt: tuple[str | None, list[int]],
        output: RequestOutput,
        completion: CompletionOutput,
        echoed: list[bool],
        offsets: list[int],
    ) -> CompletionResponseStreamChoice | None:
        """Choice ``index``'s part of a stream chunk (None: nothing new to send); the
        first one echoes the prompt when asked.  Updates ``echoed`` and ``offsets``."""
        delta_text = completion.text
        delta_ids: Sequence[int] = completion.token_ids
        delta_lps: list[dict[int, Logprob] | None] = list(completion.logprobs or [])
        if request.echo and not echoed[index]:
            echoed[index] = True
            text, ids = prompt
            delta_text = self._prompt_text(text, ids) + delta_text
            delta_ids = [*ids, *delta_ids]
            delta_lps = [*(output.prompt_logprobs or [None] * len(ids)), *delta_lps]
        logprobs = None
        if request.logprobs is not None:
            logprobs = self.legacy_logprobs(delta_ids, delta_lps, request.logprobs, offsets[index])
        offsets[index] += len(delta_text)
        if not delta_text and completion.finish_reason is None and not delta_ids:
            return None
        return CompletionResponseStreamChoice(
            index=index,
            text=delta_text,
            logprobs=logprobs,
            finish_reason=completion.finish_reason,
            stop_reason=completion.stop_reason,
        )

    def legacy_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Logprob] | None],
        num_top: int,
        initial_offset: int,
    ) -> CompletionLogProbs:
        """The completions API's ``logprobs`` object for ``token_ids``."""
        return build_legacy_logprobs(token_ids, logprobs, num_top, initial_offset, self._decode)

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def build_legacy_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[dict[int, Logprob] | None],
    num_top: int,
    initial_offset: int,
    decode: Callable[[int], str],
) -> CompletionLogProbs:
    """tokens / token_logprobs / top_logprobs / text_offset, one entry per token.

    A position without logprobs (the first prompt token) gets None entries.  Each
    top_logprobs dict holds the sampled token plus the ``num_top`` most likely ones.
    """
    tokens: list[str] = []
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offset = initial_offset
    for token_id, position in zip(token_ids, logprobs, strict=False):
        entry = position.get(token_id) if position else None
        token = entry.decoded_token if entry and entry.decoded_token is not None else None
        token = token if token is not None else decode(token_id)
        tokens.append(token)
        text_offset.append(offset)
        offset += len(token)
        if position is None or entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(clamp_logprob(entry.logprob))
        top: dict[str, float] = {}
        for tid, lp in position.items():
            if tid == token_id or (lp.rank is not None and lp.rank <= num_top):
                name = lp.decoded_token if lp.decoded_token is not None else decode(tid)
                top[name] = clamp_logprob(lp.logprob)
        top_logprobs.append(top)
    # Passed to the constructor, not appended to its defaults: stream chunks are dumped
    # with exclude_unset, which would drop fields it never saw set (sending "{}").
    return CompletionLogProbs(
        text_offset=text_offset,
        token_logprobs=token_logprobs,
        tokens=tokens,
        top_logprobs=top_logprobs,
    )
