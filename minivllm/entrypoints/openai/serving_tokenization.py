"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extensions to the OpenAI API)."""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError


class OpenAIServingTokenization(OpenAIServingChat):
    """Tokenizes text or a chat conversation with the served model's tokenizer."""

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        self.warn_unknown_fields(request)
        if isinstance(request, TokenizeChatRequest):
            _, ids = await self.render(request)
        else:
            [ids] = await self.encode([request.prompt], request.add_special_tokens)
        return TokenizeResponse(count=len(ids), max_model_len=self.max_model_len, tokens=ids)

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        self.warn_unknown_fields(request)
        vocab = self.engine.model_config.get_vocab_size()
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise OpenAIServingError(
                f"token id {bad[0]} is out of vocabulary (size {vocab})", param="tokens"
            )
        return DetokenizeResponse(prompt=await self.decode(request.tokens))
