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
    OpenAIServing,
    OpenAIServingError,
    clamp_logprob,
    engine_request_id,
    prompt_logprobs_of,
    start_streams,
    usage_of,
)
from minivllm.entrypoints.openai.sse_stream import StreamUsage, framed, sse
from minivllm.entrypoints.openai.tool_parsers import ToolParser, get_tool_parser
from minivllm.entrypoints.openai.tool_stream import ToolStream
from minivllm.entrypoints.openai.tools import ToolPlan, conversation_entry
from minivllm.outputs import CompletionOutput, Logprob, RequestOutput
from minivllm.reasoning import ReasoningParser

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

    def __init__(
        self,
        *args: Any,
        trust_request_chat_template: bool = False,
        enable_auto_tools: bool = False,
        tool_parser: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.trust_request_chat_template = trust_request_chat_template
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser: ToolParser | None = (
            get_tool_parser(tool_parser) if tool_parser is not None else None
        )

    def tool_plan(self, request: ChatCompletionRequest) -> ToolPlan | None:
        """How the request uses its tools (400 for a tool_choice that cannot run)."""
        try:
            return ToolPlan.of(
                request.tools, request.tool_choice, self.tool_parser, self.enable_auto_tools
            )
        except ValueError as exc:
            raise OpenAIServingError(str(exc), param="tool_choice") from None

    async def render(
        self,
        request: ChatCompletionRequest | TokenizeChatRequest,
        tools: list[dict[str, Any]] | None = None,
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
        if tools is not None:
            kwargs["tools"] = tools
        try:
            conversation = [conversation_entry(message) for message in request.messages]
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
        self.warn_unknown_fields(request)
        params = self.make_params(request)
        plan = self.tool_plan(request)
        if plan is not None and request.tools:
            constraint = plan.constraint(request.tools, request.parallel_tool_calls)
            if constraint is not None:
                if params.structured_outputs is not None:
                    raise OpenAIServingError(
                        f'tool_choice "{plan.mode}" constrains the output itself; drop '
                        'response_format / structured_outputs or use tool_choice "auto"',
                        param="tool_choice",
                    )
                params.structured_outputs = constraint
        text, ids = await self.render(request, plan.template_tools if plan else None)
        validated = await self.validate(ids, params, request.priority, request.model)
        request_id = request.request_id or random_id("chatcmpl")
        engine_id = engine_request_id(request_id)
        self.log_request(engine_id, text, ids, params)
        generator = self.iterate(validated, engine_id)
        created = int(time.time())
        if request.stream:
            [generator] = await start_streams([generator])
            return self._stream(request, request_id, created, model, len(ids), generator, plan)
        return await self._full(request, request_id, created, model, len(ids), generator, plan)

    async def _full(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        created: int,
        model: str,
        num_prompt_tokens: int,
        generator: AsyncIterator[RequestOutput],
        plan: ToolPlan | None,
    ) -> ChatCompletionResponse:
        """The whole (non-streaming) answer."""
        final: RequestOutput | None = None
        try:
            async for output in generator:
                final = output
        except Exception as exc:
            raise OpenAIServingError.from_exception(exc) from None
        assert final is not None
        choices = [self._choice(request, completion, plan) for completion in final.outputs]
        num_completion_tokens = sum(len(c.token_ids) for c in final.outputs)
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage_of(num_prompt_tokens, num_completion_tokens),
            prompt_logprobs=None if request.prompt_logprobs is None else prompt_logprobs_of(final),
            kv_transfer_params=final.kv_transfer_params,
        )

    def _choice(
        self, request: ChatCompletionRequest, completion: CompletionOutput, plan: ToolPlan | None
    ) -> ChatCompletionResponseChoice:
        logprobs = None
        if request.logprobs:
            logprobs = self.chat_logprobs(
                completion.token_ids, completion.logprobs or [], request.top_logprobs or 0
            )
        content: str | None = completion.text
        reasoning = None
        parser = self.reasoning_parser(request.chat_template_kwargs)
        if parser is not None:
            # Tool calls are looked for in the answer only, never in the thinking.
            reasoning, content = parser.extract_reasoning(completion.text)
            reasoning = reasoning if request.include_reasoning else None
        tool_calls = []
        finish_reason = completion.finish_reason
        if plan is not None:
            content, tool_calls = plan.extract(content or "")
            finish_reason = _finish_reason(plan, finish_reason, bool(tool_calls))
        message = ChatResponseMessage(
            role=ROLE,
            content=content,
            tool_calls=tool_calls,
            reasoning=reasoning,
            reasoning_content=reasoning,
        )
        return ChatCompletionResponseChoice(
            index=completion.index,
            message=message,
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=completion.stop_reason,
            spec_decode_metrics=completion.spec_decode_metrics,
        )

    def _stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        created: int,
        model: str,
        num_prompt_tokens: int,
        generator: AsyncIterator[RequestOutput],
        plan: ToolPlan | None = None,
    ) -> AsyncIterator[str]:
        usage = StreamUsage.of(request.stream_options, num_prompt_tokens, request.n)
        tool_streams = [ToolStream(plan) for _ in range(request.n)] if plan else None
        parsers = [self.reasoning_parser(request.chat_template_kwargs) for _ in range(request.n)]

        def chunk(index: int, delta: DeltaMessage, **kwargs: Any) -> str:
            body = ChatCompletionStreamResponse(
                id=request_id,
                created=created,
                model=model,
                choices=[ChatCompletionResponseStreamChoice(index=index, delta=delta, **kwargs)],
            )
            return sse(usage.stamp(body))

        async def events() -> AsyncIterator[str]:
            # Role first, for every choice, before any content (as OpenAI and vLLM do).
            for index in range(request.n):
                yield chunk(index, DeltaMessage(role=ROLE, content=""), logprobs=None,
                            finish_reason=None)  # fmt: skip
            async for output in generator:
                for completion in output.outputs:
                    usage.num_tokens[completion.index] += len(completion.token_ids)
                    tools = tool_streams[completion.index] if tool_streams else None
                    parser = parsers[completion.index]
                    deltas = self._stream_deltas(request, completion, tools, parser)
                    for index, delta, extra in deltas:
                        yield chunk(index, delta, **extra)

        return framed(
            events(),
            lambda: usage.closing(ChatCompletionStreamResponse, request_id, created, model),
        )

    def _stream_deltas(
        self,
        request: ChatCompletionRequest,
        completion: CompletionOutput,
        tools: ToolStream | None,
        parser: ReasoningParser | None = None,
    ) -> list[tuple[int, DeltaMessage, dict[str, Any]]]:
        """The chunks (choice index, delta, other choice fields) that this output of one
        choice adds to the stream: none, one, or more when the output holds reasoning
        and content, or the end releases held text."""
        finished = completion.finish_reason is not None
        if not completion.text and not finished and not completion.token_ids:
            return []
        logprobs = None
        if request.logprobs:
            logprobs = self.chat_logprobs(
                completion.token_ids, completion.logprobs or [], request.top_logprobs or 0
            )
        extra: dict[str, Any] = {"logprobs": logprobs, "finish_reason": None}
        chunks = []
        text = completion.text
        if parser is not None:
            split = parser.feed(text, completion.token_ids, final=finished)
            reasoning, text = split.reasoning, split.content or ""
            if reasoning and request.include_reasoning:
                delta = DeltaMessage(reasoning=reasoning, reasoning_content=reasoning)
                chunks.append((completion.index, delta, dict(extra)))
                extra["logprobs"] = None  # sent once, with the first chunk
            if not text and not finished:
                return chunks
        before, delta = _deltas(text, tools, finished)
        if before is not None:
            chunks.append((completion.index, before, dict(extra)))
        if finished:
            reason = completion.finish_reason
            if tools is not None:
                reason = _finish_reason(tools.plan, reason, tools.tools_called)
            extra.update(finish_reason=reason, stop_reason=completion.stop_reason)
        if delta is not None or finished:
            chunks.append((completion.index, delta or DeltaMessage(content=""), extra))
        return chunks

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


def _deltas(
    text: str, tools: ToolStream | None, finished: bool
) -> tuple[DeltaMessage | None, DeltaMessage | None]:
    """(a delta to send first or None, the delta of this output or None) for new
    ``text``: plain content, or what the tool-call stream releases (at the end, the
    text it held back comes after the last delta)."""
    if tools is None:
        return None, DeltaMessage(content=text)
    delta = tools.feed(text)
    if not finished:
        return None, delta
    held = tools.finish()
    if held is None:
        return None, delta
    return delta, held


def _finish_reason(plan: ToolPlan, reason: str | None, tools_called: bool) -> str | None:
    """ "tool_calls" when the model called tools of its own choice (auto) or as required;
    a named function keeps the engine's reason ("stop"), as OpenAI and vLLM do."""
    if tools_called and plan.mode in ("auto", "required") and reason == "stop":
        return "tool_calls"
    return reason


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
