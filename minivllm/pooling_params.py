"""Per-request parameters of pooling models (vLLM's `PoolingParams`).

Torch-free: the engine's input side and the scheduler import it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from minivllm.config.pooler import PoolerConfig

PoolingTask = Literal["embed", "classify", "score", "encode"]
"""What a request asks of a pooling model: an embedding, class probabilities, a
pair's score (a classifier over the pair, or the cosine of two embeddings), or the
pooler's output as it is ("encode": ALL pooling's per-token states, say)."""

TASKS_OF_CONVERT: dict[str, tuple[str, ...]] = {
    "embed": ("embed", "score", "encode"),
    "classify": ("classify", "score", "encode"),
}
"""The tasks a model of each ``convert_type`` serves."""

TOKEN_TYPE_SHIFT = 30
"""A token of type 1 (the second text of a cross-encoder pair) reaches the model as
``token_id | 1 << TOKEN_TYPE_SHIFT`` (vLLM's packing): models with token type
embeddings (BERT) split the two, so the flat ``input_ids`` carry both."""


@dataclass
class PoolingParams:
    """API parameters of one pooling request; None fields take the model's
    `PoolerConfig` values when the engine accepts the request (`verify`)."""

    truncate_prompt_tokens: int | None = None
    """Keep only the last k prompt tokens (-1: the model's max_model_len); None: all."""
    dimensions: int | None = None
    """Matryoshka truncation of the embedding (at most the hidden size)."""
    normalize: bool | None = None
    """L2-normalize the embedding."""
    use_activation: bool | None = None
    """Apply the classifier's activation (softmax, or sigmoid for one label)."""
    task: PoolingTask | None = None
    """Set by the entry point (`LLM.embed`, `/v1/embeddings`, ...)."""
    extra_kwargs: dict[str, Any] | None = None
    """Set by the entry point: ``{"compressed_token_type_ids": k}`` for a text pair
    run by a cross-encoder with token types: tokens ``k`` onwards have type 1."""

    @property
    def token_type_start(self) -> int | None:
        """The first token of type 1, or None (every token has type 0)."""
        return (self.extra_kwargs or {}).get("compressed_token_type_ids")

    def clone(self) -> PoolingParams:
        return copy.deepcopy(self)

    def verify(self, task: str, convert_type: str, pooler: PoolerConfig, hidden_size: int) -> None:
        """Check the request against the model and fill the unset fields from ``pooler``."""
        served = TASKS_OF_CONVERT.get(convert_type, ())
        if task not in served:
            raise ValueError(
                f"this model ({convert_type} pooling model) does not serve the {task!r} task; "
                f"it serves {', '.join(served)}"
            )
        self.task = task  # type: ignore[assignment]
        if self.dimensions is not None:
            if convert_type != "embed":
                raise ValueError("dimensions applies to embedding models only")
            if not 1 <= self.dimensions <= hidden_size:
                raise ValueError(
                    f"dimensions={self.dimensions} is out of range: this model's embeddings "
                    f"have {hidden_size} dimensions; use 1 to {hidden_size}"
                )
        if self.dimensions is None:
            self.dimensions = pooler.dimensions
        if self.normalize is None:
            self.normalize = bool(pooler.normalize)
        if self.use_activation is None:
            self.use_activation = bool(pooler.use_activation)
