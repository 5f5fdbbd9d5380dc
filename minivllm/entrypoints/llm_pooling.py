"""`LLM`'s pooling methods (vLLM's): encode, embed, classify and score.

They need a pooling model (``LLM(model, runner="pooling")``, or an architecture
that is one: BERT, ``Qwen3Model``, ``*ForSequenceClassification``); a generation
model refuses them with a ValueError naming ``runner="pooling"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.nn.functional as F

from minivllm.engine.pooling import embed_chunks, regroup_chunks
from minivllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from minivllm.pooling_params import PoolingParams

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.engine.llm_engine import LLMEngine, PromptInput


def as_prompt_list(prompts: Any) -> list[PromptInput]:
    """One prompt or a sequence of prompts -> a list (a flat int list is one prompt)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    return list(prompts)


class PoolingMixin:
    """The pooling half of `LLM` (it provides ``llm_engine`` and ``_run_engine``)."""

    llm_engine: LLMEngine
    _run_engine: Any

    def encode(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        pooling_task: str = "encode",
    ) -> list[PoolingRequestOutput]:
        """Pool every prompt; outputs in the prompts' order (``.outputs.data``)."""
        prompt_list = as_prompt_list(prompts)
        params_list = params_per_prompt(pooling_params, len(prompt_list))
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for prompt, params in zip(prompt_list, params_list, strict=True):
                validated = engine.input_processor.process_pooling(prompt, params, pooling_task)
                ids.append(engine.add_request(None, validated))
        except Exception:
            engine.abort_request(ids)
            raise
        outputs = self._run_engine(ids, use_tqdm)
        for out in outputs:
            if not isinstance(out, PoolingRequestOutput):
                raise ValueError(f"request {out.request_id} failed: {out.error}")
        return outputs

    def embed(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (``.outputs.embedding``); with the pooler's
        ``enable_chunked_processing`` a prompt longer than the context is embedded in
        chunks (see `minivllm.engine.pooling`)."""
        prompt_list = as_prompt_list(prompts)
        params_list = params_per_prompt(pooling_params, len(prompt_list))
        model_config = self.llm_engine.vllm_config.model_config
        pooler = model_config.pooler_config
        if pooler is None or not pooler.enable_chunked_processing:
            outs = self.encode(prompt_list, params_list, use_tqdm, pooling_task="embed")
            return [EmbeddingRequestOutput.from_base(o) for o in outs]
        inputs = [self.llm_engine.input_processor.tokenize(p)[1] for p in prompt_list]
        chunks = [
            embed_chunks(model_config, ids, p) for ids, p in zip(inputs, params_list, strict=True)
        ]
        flat = [
            prompt if len(parts) == 1 else {"prompt_token_ids": part}
            for prompt, parts in zip(prompt_list, chunks, strict=True)
            for part in parts
        ]
        flat_params = [p for p, parts in zip(params_list, chunks, strict=True) for _ in parts]
        outs = self.encode(flat, flat_params, use_tqdm, pooling_task="embed")
        counts = [len(parts) for parts in chunks]
        merged = regroup_chunks(outs, counts, inputs, params_list, model_config)
        return [EmbeddingRequestOutput.from_base(o) for o in merged]

    def classify(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt (``.outputs.probs``)."""
        outs = self.encode(prompts, pooling_params, use_tqdm, pooling_task="classify")
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def reward(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """A classifier's output for every token (``.outputs.data``: [tokens, labels]),
        as reward models give; needs ``pooler_config={"pooling_type": "ALL"}``."""
        if self.llm_engine.vllm_config.model_config.pooler_config.pooling_type != "ALL":
            raise ValueError(
                'reward scores every token: start the model with pooler_config={"pooling_type": '
                '"ALL"} (--pooler-config \'{"pooling_type": "ALL"}\')'
            )
        return self.encode(prompts, pooling_params, use_tqdm, pooling_task="classify")

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """Scores of text pairs: ``data_1`` (one text, or one per ``data_2`` text)
        against each text of ``data_2``.  An embedding model scores the cosine
        similarity of the two embeddings; a classifier with one label (a cross-encoder
        reranker) scores the pair encoded together."""
        first, second = score_pairs(data_1, data_2)
        model_config = self.llm_engine.vllm_config.model_config
        if model_config.convert_type == "embed":
            embeds = self.encode(first + second, pooling_params, use_tqdm, "embed")
            n = len(first)
            return [cosine_output(a, b) for a, b in zip(embeds[:n], embeds[n:], strict=True)]
        tokenizer = self.llm_engine.get_tokenizer()
        pairs = [encode_pair(tokenizer, a, b) for a, b in zip(first, second, strict=True)]
        prompts = [{"prompt_token_ids": ids} for ids, _ in pairs]
        params = [
            pair_params(pooling_params or PoolingParams(), start, model_config)
            for _, start in pairs
        ]
        outs = self.encode(prompts, params, use_tqdm, "score")
        return [pair_score_output(o) for o in outs]


def params_per_prompt(
    pooling_params: PoolingParams | Sequence[PoolingParams] | None, num_prompts: int
) -> list[PoolingParams]:
    """One `PoolingParams` for all prompts, or one per prompt (checked)."""
    if pooling_params is None or isinstance(pooling_params, PoolingParams):
        return [pooling_params or PoolingParams()] * num_prompts
    params_list = list(pooling_params)
    if len(params_list) != num_prompts:
        raise ValueError(
            f"got {len(params_list)} pooling params for {num_prompts} prompts; "
            "give one, or one per prompt"
        )
    return params_list


def score_pairs(data_1: str | Sequence[str], data_2: str | Sequence[str]) -> tuple[list, list]:
    """vLLM's pairing: one text against many, or the two lists element by element."""
    first = [data_1] if isinstance(data_1, str) else list(data_1)
    second = [data_2] if isinstance(data_2, str) else list(data_2)
    if not first or not second:
        raise ValueError("score needs at least one text on each side")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError(
            f"score pairs one text with many or two lists of equal length; got "
            f"{len(first)} and {len(second)} texts"
        )
    return first, second


def encode_pair(tokenizer: Any, text_1: str, text_2: str) -> tuple[list[int], int | None]:
    """A pair's token ids as the tokenizer joins them, and where its token type 1 (the
    second text, for tokenizers that mark it: BERT's) starts, or None."""
    encoded = tokenizer(text_1, text_2)
    types = list(encoded.get("token_type_ids") or [])
    return list(encoded["input_ids"]), types.index(1) if 1 in types else None


def pair_params(
    params: PoolingParams, token_type_start: int | None, model_config: ModelConfig
) -> PoolingParams:
    """``params`` for one pair: with its token types for a model that embeds them (an
    encoder: BERT), as vLLM's ``compressed_token_type_ids``."""
    if token_type_start is None or not model_config.is_encoder_only:
        return params
    params = params.clone()
    extra = dict(params.extra_kwargs or {})
    extra["compressed_token_type_ids"] = token_type_start
    params.extra_kwargs = extra
    return params


def cosine_output(a: PoolingRequestOutput, b: PoolingRequestOutput) -> ScoringRequestOutput:
    """The cosine similarity of two embeddings as a score."""
    score = F.cosine_similarity(a.outputs.data, b.outputs.data, dim=0).item()
    tokens = [*a.prompt_token_ids, *b.prompt_token_ids]
    return ScoringRequestOutput(f"{a.request_id}-{b.request_id}", ScoringOutput(score), tokens)


def pair_score_output(out: PoolingRequestOutput) -> ScoringRequestOutput:
    """A one-label classifier's output on a pair as a score."""
    data = out.outputs.data
    if data.numel() != 1:
        raise ValueError(
            f"scoring with a classifier needs one label (a cross-encoder); this model has "
            f"{data.numel()}"
        )
    return ScoringRequestOutput(out.request_id, ScoringOutput(data.item()), out.prompt_token_ids)
