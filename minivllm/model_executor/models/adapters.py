"""A decoder family run as a pooling model: the LM head replaced by a pooler.

``as_pooling_model(Qwen3ForCausalLM, "embed")`` is the Qwen3 decoder whose last
hidden states the runner pools (Qwen3-Embedding, gte-Qwen2, Llama-based embedders);
``"classify"`` adds the ``score`` head of HF's ``*ForSequenceClassification``
(``[num_labels, hidden]``, no bias), applied to the pooled state.  Checkpoints of a
base ``*Model`` (tensor names without the ``model.`` prefix), of a causal LM (its
``lm_head`` is ignored) and of a sequence classifier all load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from minivllm.model_executor.layers.linear import ReplicatedLinear
from minivllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from minivllm.model_executor.models.utils import (
    LLAMA_STACKED_PARAMS,
    load_weights_stacked,
    maybe_prefix,
    set_default_torch_dtype,
)

_BASE_PREFIXES = ("embed_tokens.", "layers.", "norm.")
"""Tensor names of a bare ``*Model`` checkpoint (no ``model.`` prefix)."""


class DecoderPoolingModel(nn.Module):
    """A Llama-family decoder without its LM head, for the pooling runner."""

    base_cls: type[LlamaForCausalLM] = LlamaForCausalLM
    """The causal LM whose decoder (and attention options) this model uses."""
    task: str = "embed"
    """"embed" (pooled hidden states) or "classify" (plus the score head)."""
    is_encoder_only = False

    def __init__(self, hf_config: Any, *, dtype: torch.dtype = torch.float32, prefix: str = ""):
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        with set_default_torch_dtype(dtype):
            self.model = LlamaModel(
                hf_config,
                self.base_cls.attn_options(hf_config),
                prefix=maybe_prefix(prefix, "model"),
            )
            self.score: ReplicatedLinear | None = None
            if self.task == "classify":
                self.score = ReplicatedLinear(hf_config.hidden_size, hf_config.num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden_size] of a flat batch of T tokens."""
        return self.model(input_ids, positions)

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled states [N, H] -> embeddings [N, H], or float32 logits [N, labels]."""
        if self.score is None:
            return pooled
        return self.score(pooled.to(self.score.weight.dtype)).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors of a base model, a causal LM or a classifier."""

        def renamed() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(_BASE_PREFIXES):
                    name = "model." + name
                if name.startswith("lm_head.") or (
                    self.score is None and name.startswith("score.")
                ):
                    continue
                yield name, tensor

        return load_weights_stacked(self, renamed(), LLAMA_STACKED_PARAMS)


def as_pooling_model(base_cls: type[nn.Module], task: str) -> type[nn.Module]:
    """The pooling class for a causal LM class and a task ("embed" / "classify")."""
    if not issubclass(base_cls, LlamaForCausalLM):
        raise ValueError(
            f"{base_cls.__name__} cannot run as a pooling model in minivllm; the "
            "Llama, Qwen2 and Qwen3 families (and BERT) can"
        )
    suffix = "EmbeddingModel" if task == "embed" else "ForSequenceClassification"
    name = base_cls.__name__.removesuffix("ForCausalLM") + suffix
    return type(name, (DecoderPoolingModel,), {"base_cls": base_cls, "task": task})
