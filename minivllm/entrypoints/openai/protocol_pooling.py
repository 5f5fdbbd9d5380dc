"""Request and response bodies of the pooling endpoints, in the shapes vLLM serves:
OpenAI's ``/v1/embeddings``, vLLM's ``/pooling``, ``/classify`` and ``/score``, and
the Jina / Cohere ``/rerank`` shape."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from minivllm.entrypoints.openai.protocol import (
    OpenAIBaseModel,
    OpenAIRequest,
    UsageInfo,
    random_id,
)

PoolingInput = str | list[str] | list[int] | list[list[int]]
"""One text, several texts, one token-id list, or several token-id lists."""


class PoolingRequestBase(OpenAIRequest):
    """Fields every pooling request shares (vLLM's extensions included)."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    """Keep only the last k tokens of each input (-1: the model's context length)."""


class EmbeddingRequest(PoolingRequestBase):
    """``/v1/embeddings``: OpenAI's request, plus vLLM's ``normalize``."""

    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    """Matryoshka truncation of each embedding (at most the model's hidden size)."""
    normalize: bool | None = None


class PoolingRequest(PoolingRequestBase):
    """``/pooling``: the model's pooled output as it is (``encode``)."""

    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None


class ClassificationRequest(PoolingRequestBase):
    """``/classify``: class probabilities of each input."""

    input: PoolingInput
    use_activation: bool | None = None


class ScoreRequest(PoolingRequestBase):
    """``/score``: ``text_1`` (one text, or one per ``text_2`` text) against ``text_2``."""

    text_1: str | list[str]
    text_2: str | list[str]


class RerankRequest(PoolingRequestBase):
    """``/rerank`` (Jina / Cohere shape): documents ordered by relevance to the query."""

    query: str
    documents: list[str]
    top_n: int | None = Field(default=None, ge=0)
    """Return only the best ``top_n`` documents (None or 0: all)."""
    return_documents: bool = True


class EmbeddingData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("embd"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


class PoolingData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: Any


class PoolingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("pool"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ClassificationData(OpenAIBaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("classify"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("score"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(OpenAIBaseModel):
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("rerank"))
    model: str
    usage: RerankUsage
    results: list[RerankResult]
