"""The pooling endpoints' handler: /v1/embeddings, /pooling, /classify, /score, /rerank.

Each input becomes one engine request (token ids validated by the engine, which
refuses a generation model with a 400 naming ``--runner pooling``); the outputs come
back in the inputs' order.  Texts are tokenized in the tokenizer pool."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from minivllm.engine.pooling import embed_chunks, regroup_chunks
from minivllm.entrypoints.llm_pooling import (
    cosine_output,
    encode_pair,
    pair_params,
    pair_score_output,
    score_pairs,
)
from minivllm.entrypoints.openai.protocol import UsageInfo, random_id
from minivllm.entrypoints.openai.protocol_pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingInput,
    PoolingRequest,
    PoolingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from minivllm.entrypoints.openai.serving_engine import (
    OpenAIServing,
    OpenAIServingError,
    engine_request_id,
)
from minivllm.outputs import PoolingRequestOutput, ScoringRequestOutput
from minivllm.pooling_params import PoolingParams


class OpenAIServingPooling(OpenAIServing):
    """Runs pooling requests and shapes their answers."""

    async def create_embedding(self, request: EmbeddingRequest) -> EmbeddingResponse:
        model = self.check_model(request.model)
        params = PoolingParams(
            request.truncate_prompt_tokens, request.dimensions, request.normalize
        )
        inputs = await self._token_ids(request.input)
        config = self.engine.model_config
        try:
            chunks = [embed_chunks(config, ids, params) for ids in inputs]
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None
        outs = await self._run([part for parts in chunks for part in parts], params, "embed")
        counts = [len(parts) for parts in chunks]
        outs = regroup_chunks(outs, counts, inputs, [params] * len(inputs), config)
        data = [
            EmbeddingData(index=i, embedding=_encode(o.outputs.data, request.encoding_format))
            for i, o in enumerate(outs)
        ]
        return EmbeddingResponse(model=model, data=data, usage=_usage(outs))

    async def create_pooling(self, request: PoolingRequest) -> PoolingResponse:
        model = self.check_model(request.model)
        params = PoolingParams(
            request.truncate_prompt_tokens,
            request.dimensions,
            request.normalize,
            request.use_activation,
        )
        outs = await self._run(await self._token_ids(request.input), params, "encode")
        data = [
            PoolingData(index=i, data=_encode(o.outputs.data, request.encoding_format))
            for i, o in enumerate(outs)
        ]
        return PoolingResponse(model=model, data=data, usage=_usage(outs))

    async def create_classify(self, request: ClassificationRequest) -> ClassificationResponse:
        model = self.check_model(request.model)
        params = PoolingParams(
            request.truncate_prompt_tokens, use_activation=request.use_activation
        )
        outs = await self._run(await self._token_ids(request.input), params, "classify")
        labels = getattr(self.engine.model_config.hf_config, "id2label", None) or {}
        data = []
        for i, out in enumerate(outs):
            probs = out.outputs.data.tolist()
            best = max(range(len(probs)), key=probs.__getitem__)
            label = labels.get(best, labels.get(str(best)))
            data.append(
                ClassificationData(index=i, label=label, probs=probs, num_classes=len(probs))
            )
        return ClassificationResponse(model=model, data=data, usage=_usage(outs))

    async def create_score(self, request: ScoreRequest) -> ScoreResponse:
        model = self.check_model(request.model)
        scores = await self._score(request.text_1, request.text_2, request.truncate_prompt_tokens)
        data = [ScoreData(index=i, score=s.outputs.score) for i, s in enumerate(scores)]
        return ScoreResponse(model=model, data=data, usage=_usage(scores))

    async def create_rerank(self, request: RerankRequest) -> RerankResponse:
        model = self.check_model(request.model)
        if not request.documents:
            raise OpenAIServingError("documents is empty; give at least one", param="documents")
        scores = await self._score(request.query, request.documents, request.truncate_prompt_tokens)
        order = sorted(range(len(scores)), key=lambda i: -scores[i].outputs.score)
        if request.top_n:
            order = order[: request.top_n]
        results = [
            RerankResult(
                index=i,
                document=RerankDocument(text=request.documents[i])
                if request.return_documents
                else None,
                relevance_score=scores[i].outputs.score,
            )
            for i in order
        ]
        total = sum(len(s.prompt_token_ids) for s in scores)
        return RerankResponse(model=model, usage=RerankUsage(total_tokens=total), results=results)

    # -- shared -------------------------------------------------------------------
    async def _token_ids(self, inputs: PoolingInput) -> list[list[int]]:
        """Token ids of each input; 400 for an empty list, an empty string or token list."""
        if isinstance(inputs, str):
            inputs = [inputs]
        if not inputs:
            raise OpenAIServingError(
                "input is an empty list; give at least one input", param="input"
            )
        if all(isinstance(t, int) for t in inputs):
            return [list(inputs)]  # type: ignore[arg-type]
        for i, item in enumerate(inputs):
            if not item:
                what = "an empty string" if isinstance(item, str) else "an empty token list"
                raise OpenAIServingError(
                    f"input[{i}] is {what}; every input needs text", param="input"
                )
        if all(isinstance(t, str) for t in inputs):
            return await self.encode(list(inputs))  # type: ignore[arg-type]
        return [list(t) for t in inputs]  # type: ignore[arg-type]

    async def _run(
        self, prompts: list[list[int]], params: PoolingParams | list[PoolingParams], task: str
    ) -> list[PoolingRequestOutput]:
        """Run every prompt (validated first: one bad input refuses the request) with
        its params (one for all, or one per prompt)."""
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        try:
            validated = [
                self.engine.process_pooling(ids, p, task)
                for ids, p in zip(prompts, per_prompt, strict=True)
            ]
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None
        base = random_id("pool")
        return list(
            await asyncio.gather(
                *(
                    _final(self.iterate(v, engine_request_id(f"{base}-{i}")))
                    for i, v in enumerate(validated)
                )
            )
        )

    async def _score(
        self, text_1: str | list[str], text_2: str | list[str], truncate: int | None
    ) -> list[ScoringRequestOutput]:
        """vLLM's scoring: cosine of embeddings, or a cross-encoder over each pair."""
        try:
            first, second = score_pairs(text_1, text_2)
        except ValueError as exc:
            raise OpenAIServingError(str(exc), param="text_2") from None
        if any(not t for t in first + second):
            raise OpenAIServingError("an input text is empty; every text needs content")
        params = PoolingParams(truncate)
        if self.engine.model_config.convert_type == "embed":
            outs = await self._run(await self.encode(first + second), params, "embed")
            n = len(first)
            return [cosine_output(a, b) for a, b in zip(outs[:n], outs[n:], strict=True)]
        pairs = await self.pool.run(_encode_pairs, first, second)
        config = self.engine.model_config
        outs = await self._run(
            [ids for ids, _ in pairs], [pair_params(params, s, config) for _, s in pairs], "score"
        )
        try:
            return [pair_score_output(o) for o in outs]
        except ValueError as exc:
            raise OpenAIServingError.from_exception(exc) from None


async def _final(outputs: Any) -> PoolingRequestOutput:
    """The last output of a request's stream (a pooling request has one)."""
    last = None
    async for output in outputs:
        last = output
    if not isinstance(last, PoolingRequestOutput):
        raise OpenAIServingError("the request was aborted before its output was ready")
    return last


def _encode_pairs(
    tokenizer: Any, first: list[str], second: list[str]
) -> list[tuple[list[int], int | None]]:
    return [encode_pair(tokenizer, a, b) for a, b in zip(first, second, strict=True)]


def _encode(data: Any, encoding_format: str) -> list[float] | str:
    """Floats, or OpenAI's base64 of little-endian float32 values."""
    if encoding_format == "base64":
        return base64.b64encode(data.float().numpy().astype("<f4").tobytes()).decode()
    return data.tolist()


def _usage(outs: list[Any]) -> UsageInfo:
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return UsageInfo(prompt_tokens=tokens, total_tokens=tokens, completion_tokens=0)
