"""``POST /v1/chat/completions``: messages rendered with the model's chat template.

In a stream each choice's first chunk carries ``delta.role``, content follows in
later chunks, and the chunk that ends a choice carries its ``finish_reason``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProbContent,
    ChatLogProbEntry,
    ChatLogProbs,
    ChatResponseMessage,
    DeltaMessage,
    TokenizeChatRequest,
    random_id,
)
from minivllm.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIServing,
    OpenAIServingError,
    clamp_logprob,
    engine_request_id,
    sse,
    sse_error,
    sse_usage,
    start_streams,
    stream_usage_options,
    usage_of,
)
from minivllm.outputs import Logprob, RequestOutput

ROLE = "assistant"
"""The role of every generated message."""


UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)
"""vLLM's message for a request-supplied template the server does not trust."""

_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message",
     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "padding",
     "truncation", "max_length", "return_tensors"}
)  # fmt: skip
"""Arguments of the template call itself, which chat_template_kwargs may not override."""


class OpenAIServingChat(OpenAIServing):
    """Handler of the chat completions endpoint (and of chat-style /tokenize)."""

    def __init__(self, *args: Any, trust_request_chat_template: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.trust_request_chat_template = trust_request_chat_template

    async def render(
        self, request: ChatCompletionRequest | TokenizeChatRequest
    ) -> tuple[str, list[int]]:
        """The prompt text and token ids of the request's conversation, rendered with its
        template options in the tokenizer pool (400 for content the template cannot take,
        or a template the server does not trust)."""
        add_generation_prompt = request.add_generation_prompt
        continue_final_message = request.continue_final_message
        if continue_final_message and add_generation_prompt:
            raise OpenAIServingError(
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message",
            )
        kwargs = dict(request.chat_template_kwargs or {})
        template = request.chat_template
        if template is None and "chat_template" in kwargs:
            template = kwargs.pop("chat_template")  # vLLM accepts it there too
        kwargs.pop("chat_template", None)
        if template is not None and not self.trust_request_chat_template:
            raise OpenAIServingError(UNTRUSTED_TEMPLATE, param="chat_template")
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
        if reserved:
            raise OpenAIServingError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: use the request's "
                "own fields (add_generation_prompt, continue_final_message) instead",
                param="chat_template_kwargs",
            )
        if continue_final_message:
            kwargs["continue_final_message"] = True
        try:
            conversation = []
            for message in request.messages:
                entry: dict[str, Any] = {"role": message.role, "content": message.text()}
                if message.name is not None:
                    entry["name"] = message.name
                conversation.append(entry)
            return await self.pool.run(
                _render, conversation, add_generation_prompt, template, kwargs
            )
        except Exception as exc:  # jinja errors too: the messages do not fit the template
            raise OpenAIServingError(
                f"cannot apply the chat template: {exc}", param="messages"
            ) from None

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | AsyncIterator[str]:
        """The response, or the SSE stream when ``stream`` is set."""
        model = self.check_model(request.model)
        params = self.make_params(request)
        text, ids = await self.render(request)
        self.validate(ids, params, request.priority)
        request_id = request.request_id or random_id("chatcmpl")
        engine_id = engine_request_id(request_id)
        self.log_request(engine_id, text, ids, params)
        generator = self.iterate(ids, params, engine_id, request.priority)
        created = int(time.time())
        if request.stream:
            [generator] = await start_streams([generator])
            return self._stream(request, request_id, created, model, len(ids), generator)
        final: RequestOutput | None = None
        try:
            async for output in generator:
                final = output
        except Exception as exc:
            raise OpenAIServingError.from_exception(exc) from None
        assert final is not None
        choices = []
        num_completion_tokens = 0
        for completion in final.outputs:
            num_completion_tokens += len(completion.token_ids)
            logprobs = None
            if request.logprobs:
                logprobs = self.chat_logprobs(
                    completion.token_ids, completion.logprobs or [], request.top_logprobs or 0
                )
            choices.append(
                ChatCompletionResponseChoice(
                    index=completion.index,
                    message=ChatResponseMessage(role=ROLE, content=completion.text),
                    logprobs=logprobs,
                    finish_reason=completion.finish_reason,
                    stop_reason=completion.stop_reason,
                    spec_decode_metrics=completion.spec_decode_metrics,
                )
            )
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage_of(len(ids), num_completion_tokens),
        )

    async def _stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        created: int,
        model: str,
        num_prompt_tokens: int,
        generator: AsyncIterator[RequestOutput],
    ) -> AsyncIterator[str]:
        include_usage, continuous = stream_usage_options(request.stream_options)
        num_tokens = [0] * request.n

        def chunk(index: int, delta: DeltaMessage, **kwargs: Any) -> str:
            body = ChatCompletionStreamResponse(
                id=request_id,
                created=created,
                model=model,
                choices=[ChatCompletionResponseStreamChoice(index=index, delta=delta, **kwargs)],
            )
            if include_usage:  # null until the closing usage chunk, unless continuous
                body.usage = usage_of(num_prompt_tokens, sum(num_tokens)) if continuous else None
            return sse(body)

        try:
            # Role first, for every choice, before any content (as OpenAI and vLLM do).
            for index in range(request.n):
                yield chunk(index, DeltaMessage(role=ROLE, content=""), logprobs=None,
                            finish_reason=None)  # fmt: skip
            async for output in generator:
                for completion in output.outputs:
                    num_tokens[completion.index] += len(completion.token_ids)
                    finished = completion.finish_reason is not None
                    if not completion.text and not finished and not completion.token_ids:
                        continue
                    logprobs = None
                    if request.logprobs:
                        logprobs = self.chat_logprobs(
                            completion.token_ids,
                            completion.logprobs or [],
                            request.top_logprobs or 0,
                        )
                    extra: dict[str, Any] = {"logprobs": logprobs, "finish_reason": None}
                    if finished:
                        extra["finish_reason"] = completion.finish_reason
                        extra["stop_reason"] = completion.stop_reason
                    yield chunk(completion.index, DeltaMessage(content=completion.text), **extra)
            if include_usage:
                usage = usage_of(num_prompt_tokens, sum(num_tokens))
                yield sse_usage(ChatCompletionStreamResponse, request_id, created, model, usage)
        except Exception as exc:
            yield sse_error(exc)
        yield SSE_DONE

    def chat_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Logprob] | None],
        num_top: int,
    ) -> ChatLogProbs:
        """The chat API's ``logprobs.content`` list for ``token_ids``."""
        content = []
        for token_id, position in zip(token_ids, logprobs, strict=False):
            if position is None or token_id not in position:
                continue
            entry = position[token_id]
            top = sorted(
                ((tid, lp) for tid, lp in position.items() if lp.rank is not None),
                key=lambda item: item[1].rank or 0,
            )
            tops = [self._entry(tid, lp) for tid, lp in top if (lp.rank or 0) <= num_top]
            main = self._entry(token_id, entry)
            content.append(ChatLogProbContent(**main.model_dump(), top_logprobs=tops[:num_top]))
        return ChatLogProbs(content=content)

    def _entry(self, token_id: int, lp: Logprob) -> ChatLogProbEntry:
        token = (
            lp.decoded_token if lp.decoded_token is not None else self.tokenizer.decode([token_id])
        )
        return ChatLogProbEntry(
            token=token, logprob=clamp_logprob(lp.logprob), bytes=list(token.encode("utf-8"))
        )


def _render(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
    chat_template: str | None,
    kwargs: dict[str, Any],
) -> tuple[str, list[int]]:
    """Runs in a tokenizer pool thread: the rendered prompt and its token ids."""
    from minivllm.tokenizer import apply_chat_template

    text = apply_chat_template(
        tokenizer,
        conversation,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        chat_template=chat_template,
        **kwargs,
    )
    assert isinstance(text, str)
    # As apply_chat_template(tokenize=True): the template already wrote BOS/role markers.
    return text, list(tokenizer.encode(text, add_special_tokens=False))
