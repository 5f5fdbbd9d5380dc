"""What the engine returns for a request, shaped like vLLM's output classes.

Torch-free: these objects cross process boundaries and reach API handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Logprob:
    """The log probability of one token at one position."""

    logprob: float
    rank: int | None = None
    """1-based rank of the token in the distribution (1 = most likely)."""
    decoded_token: str | None = None
    """The token on its own as text, when detokenization is on."""


# One dict per generated position: token id -> its Logprob.
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt position; the first prompt token has no logprob (None).
PromptLogprobs = list[dict[int, Logprob] | None]


def make_logprobs_dict(
    sampled_token_id: int,
    sampled_logprob: float,
    sampled_rank: int,
    top_token_ids: Sequence[int],
    top_logprobs: Sequence[float],
    num_logprobs: int,
    decode: Callable[[int], str] | None = None,
) -> dict[int, Logprob]:
    """One position's logprobs dict, as vLLM builds it.

    The sampled token is always present (with its true rank); the top ``num_logprobs``
    tokens follow with ranks 1..k.  When the sampled token is among them its entry is
    simply written twice, so the dict holds k or k+1 entries.  ``num_logprobs`` trims a
    batch-wide top-k down to what this request asked for (-1 keeps all given).
    """
    keep = len(top_token_ids) if num_logprobs == -1 else min(num_logprobs, len(top_token_ids))
    result = {
        sampled_token_id: Logprob(
            sampled_logprob, sampled_rank, decode(sampled_token_id) if decode else None
        )
    }
    for rank, (token_id, logprob) in enumerate(
        zip(top_token_ids[:keep], top_logprobs[:keep], strict=True), start=1
    ):
        result[token_id] = Logprob(logprob, rank, decode(token_id) if decode else None)
    return result


@dataclass
class RequestMetrics:
    """Timestamps of a request's life (seconds, time.time()); None until reached."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0


@dataclass
class CompletionOutput:
    """One completion of a request (a request with n > 1 has n of them)."""

    index: int
    """Which of the request's n completions this is."""
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    """Sum of the sampled tokens' logprobs; None unless logprobs were requested."""
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    """None while running, then "stop", "length", "abort" or "error"."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended it; None for EOS or length."""
    spec_decode_metrics: dict[str, Any] | None = None
    """Speculative decoding acceptance of this completion so far, when
    ``per_request_spec_decode_metrics`` is "summary" or "detailed" (see
    `RequestSpecDecodeStats.summary`); None otherwise."""

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, text={self.text!r}, "
            f"token_ids={self.token_ids}, cumulative_logprob={self.cumulative_logprob}, "
            f"logprobs={self.logprobs}, finish_reason={self.finish_reason}, "
            f"stop_reason={self.stop_reason})"
        )


@dataclass
class RequestOutput:
    """The engine's answer for one request at one point of its generation."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int | None = None
    """Prompt tokens whose KV came from the prefix cache."""
    kv_transfer_params: dict | None = field(default=None, repr=False)
    error: str | None = None
    """Why the request failed, when a completion finished with reason "error" (the
    engine could not run this request's own inputs; other requests were unaffected)."""

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request into this one.

        With ``aggregate`` (DELTA outputs being collected) text, ids and logprobs of
        each completion are appended; otherwise each completion is replaced.
        """
        self.finished |= next_output.finished
        self.error = next_output.error or self.error
        self.metrics = next_output.metrics or self.metrics
        for completion in next_output.outputs:
            for i, mine in enumerate(self.outputs):
                if mine.index != completion.index:
                    continue
                if aggregate:
                    mine.text += completion.text
                    mine.token_ids = [*mine.token_ids, *completion.token_ids]
                    if completion.logprobs:
                        mine.logprobs = [*(mine.logprobs or []), *completion.logprobs]
                    mine.cumulative_logprob = completion.cumulative_logprob
                    mine.finish_reason = completion.finish_reason
                    mine.stop_reason = completion.stop_reason
                else:
                    self.outputs[i] = completion
                break
            else:
                self.outputs.append(completion)

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, "
            f"prompt_logprobs={self.prompt_logprobs}, outputs={self.outputs}, "
            f"finished={self.finished}, metrics={self.metrics}, "
            f"num_cached_tokens={self.num_cached_tokens})"
        )


@dataclass
class PoolingOutput:
    """The pooled output of one prompt (vLLM's name): ``data`` is a float32 tensor,
    [hidden] (or [dimensions]) for an embedding, [num_labels] for a classifier,
    [num_tokens, hidden] for ALL pooling."""

    data: Any


@dataclass
class PoolingRequestOutput:
    """A pooling model's answer for one request (`LLM.encode`)."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""


@dataclass
class EmbeddingOutput:
    """One embedding, as a list of floats."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """`LLM.embed`'s answer for one prompt: ``.outputs.embedding``."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        data = out.outputs.data
        if data.dim() != 1:
            raise ValueError("embed needs one vector per prompt; this model pools ALL tokens")
        return cls(out.request_id, EmbeddingOutput(data.tolist()), out.prompt_token_ids)


@dataclass
class ClassificationOutput:
    """Class probabilities (logits when the activation is off) of one prompt."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """`LLM.classify`'s answer for one prompt: ``.outputs.probs``."""

    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> ClassificationRequestOutput:
        probs = out.outputs.data.tolist()
        return cls(out.request_id, ClassificationOutput(probs), out.prompt_token_ids)


@dataclass
class ScoringOutput:
    """The relevance score of one (query, document) pair."""

    score: float


@dataclass
class ScoringRequestOutput:
    """`LLM.score`'s answer for one pair: ``.outputs.score``."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
