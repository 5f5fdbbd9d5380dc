"""Request and response bodies of the OpenAI-compatible API (OpenAI's field names).

Requests accept vLLM's extra sampling fields (top_k, min_p, repetition_penalty,
ignore_eos, ...).  Fields nobody knows are kept and logged, as vLLM does, so
clients that send newer OpenAI fields keep working; a known field of the wrong
type is a validation error, which the server turns into a 400.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_serializer,
)

from minivllm import __version__
from minivllm.entrypoints.openai.structured import StructuredOutputFields
from minivllm.entrypoints.openai.tools import (
    ChatCompletionToolsParam,
    DeltaToolCall,
    ToolCall,
    ToolChoice,
)
from minivllm.logger import init_logger
from minivllm.sampling_params import (
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_TEMPERATURE,
    MIN_REPETITION_PENALTY,
    MIN_SEED,
    RequestOutputKind,
    SamplingParams,
)

logger = init_logger(__name__)

SYSTEM_FINGERPRINT = f"minivllm-{__version__}"
"""``system_fingerprint`` of every response: which build answered (OpenAI's field)."""

MAX_N = 128
"""The most completions one request may ask for (OpenAI's cap on ``n``)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    """Keeps unknown fields instead of rejecting the request (the server logs a bounded
    summary of them, see `unknown_fields`)."""

    model_config = ConfigDict(extra="allow")


def unknown_fields(model: BaseModel, limit: int) -> tuple[int, list[str]]:
    """How many unknown fields ``model`` and the models inside it carry, and the dotted
    paths of the first ``limit`` of them (a hostile body may send thousands)."""
    found: list[str] = []
    count = 0

    def walk(value: Any, path: str) -> None:
        nonlocal count
        if isinstance(value, BaseModel):
            extra = value.model_extra or {}
            count += len(extra)
            found.extend(f"{path}{key}" for key in list(extra)[: max(0, limit - len(found))])
            for name in type(value).model_fields:
                walk(getattr(value, name), f"{path}{name}.")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}{i}.")

    walk(model, "")
    return count, found


def _find_surrogate(value: Any) -> str | None:
    """The first lone UTF-16 surrogate in the strings of ``value`` (JSON allows one as a
    ``\\udXXX`` escape, but it is not text: tokenizers and UTF-8 encoders reject it)."""
    if isinstance(value, str):
        match = _SURROGATE.search(value)
        return match.group() if match else None
    if isinstance(value, dict):
        items: Any = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = _find_surrogate(item)
        if found is not None:
            return found
    return None


class OpenAIRequest(OpenAIBaseModel):
    """Base of request bodies: every string must be valid Unicode text and every float
    finite (JSON's ``Infinity`` / ``NaN`` extensions are refused)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_lone_surrogates(cls, value: Any) -> Any:
        found = _find_surrogate(value)
        if found is not None:
            raise ValueError(
                f"contains a lone UTF-16 surrogate (U+{ord(found):04X}), which is not valid "
                "text; a \\u escape of a surrogate must be one half of a pair"
            )
        return value


class ErrorInfo(OpenAIBaseModel):
    """The ``error`` object of an error response."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """``{"error": {...}}``: the body of every 4xx/5xx answer."""

    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    """``stream_options``: what the stream adds besides the deltas."""

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class UsageInfo(OpenAIBaseModel):
    """Token counts of a request."""

    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class SamplingRequest(OpenAIRequest, StructuredOutputFields):
    """Fields shared by completion and chat requests (vLLM's sampling extensions included).

    The ranges (ge/le) are the ones `SamplingParams` enforces, so they show in the
    OpenAPI schema; the model-dependent caps (max_logprobs, the context length, token
    ids in the vocabulary) are checked by the engine.
    """

    model: str | None = None
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    # vLLM extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(
        None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY
    )
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = Field(None, ge=-1)
    priority: int = 0
    request_id: str | None = None
    """Shown as the response's ``id``; the engine runs the request under an id the server
    makes unique, so two requests with one id never touch each other."""
    thinking_token_budget: int | None = Field(None, ge=0)
    """Most tokens a reasoning model may think before its end marker is forced (needs
    --reasoning-parser)."""
    kv_transfer_params: dict[str, Any] | None = None
    """For the KV connector (disaggregated prefill): ``{"do_remote_decode": true}`` on
    the prefill instance, the prefill response's parameters on the decode instance."""

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """SamplingParams for this request; ValueError names the field at fault."""
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError(
                "prompt_logprobs are not available with stream=true (as in vLLM); send the "
                "request without stream to get them"
            )
        return SamplingParams(
            n=self.n,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=_parse_logit_bias(self.logit_bias),
            allowed_token_ids=self.allowed_token_ids,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
            structured_outputs=self.structured_outputs_of_request(),
            thinking_token_budget=self.thinking_token_budget,
            extra_args=(
                None
                if self.kv_transfer_params is None
                else {"kv_transfer_params": self.kv_transfer_params}
            ),
        )


def _parse_logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    parsed: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids (integers), got {key!r}") from None
        # OpenAI clamps biases to [-100, 100].
        parsed[token_id] = min(100.0, max(-100.0, value))
    return parsed


# -- completions -------------------------------------------------------------------
class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``."""

    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=-1)
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True

    def to_sampling_params(self) -> SamplingParams:
        params = self._sampling_params(self.max_tokens, self.logprobs)
        if self.echo and self.logprobs is not None and params.prompt_logprobs is None:
            params.prompt_logprobs = self.logprobs  # echo shows the prompt's logprobs too
        return params


class CompletionLogProbs(OpenAIBaseModel):
    """The legacy completions ``logprobs`` object."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class _SpecDecodeMetricsChoice(OpenAIBaseModel):
    """A choice that may carry per-request speculative decoding metrics
    (``--observability-config.per_request_spec_decode_metrics``); the key is left
    out of the JSON when they are off."""

    spec_decode_metrics: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_spec_metrics(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("spec_decode_metrics") is None:
            data.pop("spec_decode_metrics", None)
        return data


class PromptLogprob(OpenAIBaseModel):
    """One token's entry in ``prompt_logprobs`` (vLLM's shape)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""One entry per prompt token (None for the first): token id -> its logprob."""


class CompletionResponseChoice(_SpecDecodeMetricsChoice):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    kv_transfer_params: dict[str, Any] | None = None
    """The KV connector's parameters (a prefill instance's: where to fetch its KV)."""


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class _StreamChunk(OpenAIBaseModel):
    """Base of stream chunks: ``object`` is always sent, even when dumped with
    exclude_unset (which keeps unset optional fields out of each chunk)."""

    def model_post_init(self, context: Any) -> None:
        self.model_fields_set.update(("object", "system_fingerprint"))


class CompletionStreamResponse(_StreamChunk):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = SYSTEM_FINGERPRINT


# -- chat --------------------------------------------------------------------------
class ChatMessage(OpenAIRequest):
    """One message of a conversation (content: text or a list of text parts)."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant message's earlier tool calls (OpenAI's form)."""
    tool_call_id: str | None = None
    """A ``tool`` message's answer is to this call."""

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"only text content parts are supported, got type {part.get('type')!r}"
                )
            parts.append(part["text"])
        return "\n".join(parts)


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)
    """Deprecated by OpenAI in favour of max_completion_tokens; still honoured."""
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(0, ge=0)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    """A Jinja template to use instead of the model's; refused (400) unless the server
    runs with --trust-request-chat-template."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the chat template."""
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: ToolChoice | None = None
    """"none", "auto" (the default with tools), "required", or a named function."""
    parallel_tool_calls: bool | None = None
    """Accepted for OpenAI compatibility; the model may make several calls either way."""
    include_reasoning: bool = True
    """With a reasoning parser: return the reasoning (``message.reasoning``); false
    drops it (the answer is the same)."""

    def to_sampling_params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens
        if max_tokens is None:
            max_tokens = self.max_tokens
        logprobs = None
        if self.logprobs:
            logprobs = self.top_logprobs or 0
        elif self.top_logprobs:
            raise ValueError("top_logprobs needs logprobs=true; set it or drop top_logprobs")
        return self._sampling_params(max_tokens, logprobs)


class ChatLogProbEntry(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbContent(ChatLogProbEntry):
    top_logprobs: list[ChatLogProbEntry] = Field(default_factory=list)


class ChatLogProbs(OpenAIBaseModel):
    content: list[ChatLogProbContent] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None
    """A reasoning model's thinking (with --reasoning-parser), apart from the answer."""
    reasoning_content: str | None = None
    """The older name of ``reasoning`` (the same text), still read by many clients."""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionResponseChoice(_SpecDecodeMetricsChoice):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    prompt_logprobs: PromptLogprobs | None = None
    kv_transfer_params: dict[str, Any] | None = None
    """The KV connector's parameters (a prefill instance's: where to fetch its KV)."""


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    """The older name of ``reasoning`` (the same text)."""
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(_StreamChunk):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = SYSTEM_FINGERPRINT


# -- models, tokenization ------------------------------------------------------------
class ModelPermission(OpenAIBaseModel):
    """vLLM's (and OpenAI's former) permission entry of a model card: all open."""

    id: str = Field(default_factory=lambda: random_id("modelperm"))
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minivllm"
    root: str | None = None
    """The model's name (vLLM puts the model it loaded here; a name, never a file path)."""
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class TokenizeCompletionRequest(OpenAIRequest):
    """``POST /tokenize`` with a prompt."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(OpenAIRequest):
    """``POST /tokenize`` with chat messages (rendered with the chat template)."""

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _tokenize_kind(body: Any) -> str:
    if isinstance(body, dict):
        return "chat" if "messages" in body else "completion"
    return "chat" if isinstance(body, TokenizeChatRequest) else "completion"


TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("completion")]
    | Annotated[TokenizeChatRequest, Tag("chat")],
    Discriminator(_tokenize_kind),
]
"""A body with ``messages`` is a chat request, any other a prompt (so a validation
error names the fields of the form the client meant, not of both)."""
UNION_TAGS = frozenset({"completion", "chat"})
"""Tags of `TokenizeRequest`'s members, which lead the ``loc`` of its validation errors."""


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIRequest):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
