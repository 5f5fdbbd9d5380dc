"""Request validation, in one place: prompt + `SamplingParams` -> `ValidatedRequest`.

Every request enters the engine through `InputProcessor.process`: `LLM` (offline)
through `LLMEngine.add_request`, the server through `AsyncLLM.generate` or, to
answer a bad request with a 400 before its stream starts, through
`LLMEngine.process_inputs` called by the handler.  It tokenizes the prompt, checks
it against the model (vocabulary, context length, logprobs) and the scheduler
(`Scheduler.check_request`: chunked prefill, KV capacity, policy), compiles a
structured-output grammar, and returns a `ValidatedRequest`.  The layers below
(`LLMEngine.add_request`, `Scheduler.add_request`) take that as given and only
assert.

The context-length rule is vLLM's: a prompt must leave room for at least one
generated token (``len(prompt) < max_model_len``), and ``len(prompt) + max_tokens``
may not exceed ``max_model_len``.

Pure and thread-safe for token-id prompts (the server runs it in a worker thread
while the engine thread steps); a text prompt needs the engine's tokenizer, so it
is processed in the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from minivllm.engine.pooling import check_pooling_request
from minivllm.engine.reasoning import check_thinking_budget
from minivllm.lora.checker import AdapterChecker
from minivllm.lora.request import LoRARequest
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.manager import StructuredOutputManager

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig
    from minivllm.scheduler.scheduler import Scheduler
    from minivllm.structured_output.spec import CompiledGrammar

PromptInput = str | list[int] | dict[str, Any]
"""A text prompt, a list of token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}``."""


@dataclass(frozen=True)
class ValidatedRequest:
    """A request that passed `InputProcessor.process` (made nowhere else)."""

    prompt: str | None
    """The prompt text (None when the caller gave token ids only)."""
    prompt_token_ids: list[int]
    params: SamplingParams
    """The engine's own copy, with the model's EOS ids adopted as stop tokens."""
    priority: int = 0
    grammar: CompiledGrammar | None = None
    """The compiled grammar of a structured-output request (compiled here, once)."""
    pooling_params: PoolingParams | None = None
    """A pooling request's parameters (``params`` then only carries the prompt)."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter the request runs with (checked here), or None."""


class InputProcessor:
    """Tokenizes and validates requests for one engine."""

    def __init__(self, vllm_config: VllmConfig, tokenizer: Any, scheduler: Scheduler) -> None:
        model_config = vllm_config.model_config
        assert model_config is not None
        self.vllm_config = vllm_config
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.max_model_len: int = model_config.max_model_len
        self.vocab_size: int = model_config.get_vocab_size()
        self.max_logprobs: int = model_config.max_logprobs
        # No tokenizer with skip_tokenizer_init; a GGUF or HF one may still lack an EOS id.
        self.eos_token_id: int | None = getattr(tokenizer, "eos_token_id", None)
        # getattr: not every HF config has eos_token_id.  A list (Gemma 3: <eos> and
        # <end_of_turn>) adds stop tokens beyond the tokenizer's one EOS.
        model_eos = getattr(model_config.hf_text_config, "eos_token_id", None)
        self.model_eos_token_ids: list[int] = list(model_eos) if isinstance(model_eos, list) else []
        self._structured_outputs: StructuredOutputManager | None = None
        self.adapters = AdapterChecker(vllm_config)

    def process(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> ValidatedRequest:
        """The validated request; ValueError, with the numbers and a fix, otherwise."""
        params = (params or SamplingParams()).clone()
        text, token_ids = self.tokenize(prompt)
        self._check_prompt(token_ids, params)
        self.scheduler.check_request(len(token_ids), priority, params.n)
        params.verify_for_model(self.vocab_size, self.max_logprobs)
        check_thinking_budget(self.vllm_config, params)
        if lora_request is not None:
            self.adapters.check(lora_request)
        grammar = self._compile_grammar(params)
        params.update_from_tokenizer(self.eos_token_id)
        if self.model_eos_token_ids:
            params.update_from_generation_config(
                {"eos_token_id": self.model_eos_token_ids}, self.eos_token_id
            )
        return ValidatedRequest(
            text, token_ids, params, priority, grammar, lora_request=lora_request
        )

    def process_pooling(
        self, prompt: PromptInput, pooling_params: PoolingParams, task: str
    ) -> ValidatedRequest:
        """A pooling request (`check_pooling_request`); ValueError naming the problem."""
        text, token_ids = self.tokenize(prompt)
        if text == "":
            # A tokenizer's special tokens alone ([CLS] [SEP]) would embed nothing.
            raise ValueError("the input is empty; give a non-empty string")
        params = pooling_params.clone()
        token_ids = check_pooling_request(
            self.vllm_config.model_config, token_ids, params, task, self.vocab_size
        )
        self.scheduler.check_request(len(token_ids))
        return ValidatedRequest(
            text, token_ids, SamplingParams(max_tokens=1, detokenize=False), 0, None, params
        )

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """``(prompt text or None, prompt token ids)`` for any accepted prompt form."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "text prompts need a tokenizer; this engine was started with "
                    "skip_tokenizer_init=True, so pass token ids instead"
                )
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(
            f"unsupported prompt type {type(prompt).__name__}: give a string, a list of "
            "token ids, or a dict with 'prompt' or 'prompt_token_ids'"
        )

    def _check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The model's rules: tokens in the vocabulary, room in the context."""
        max_len, vocab = self.max_model_len, self.vocab_size
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of vocabulary (size {vocab})")
        if num_prompt >= max_len:
            raise ValueError(
                f"the prompt has {num_prompt} tokens, but this model's maximum context "
                f"length is {max_len}; shorten the prompt to leave room for at least one "
                "generated token"
            )
        if params.max_tokens is not None and num_prompt + params.max_tokens > max_len:
            raise ValueError(
                f"this model's maximum context length is {max_len} tokens, but the request "
                f"asks for {num_prompt + params.max_tokens} ({num_prompt} in the prompt + "
                f"{params.max_tokens} max_tokens); lower max_tokens or shorten the prompt"
            )

    @property
    def structured_outputs(self) -> StructuredOutputManager:
        """The grammar compiler and cache (made on first use; needs the tokenizer)."""
        if self._structured_outputs is None:
            if self.tokenizer is None:
                raise ValueError(
                    "structured outputs need the tokenizer; this engine was started with "
                    "skip_tokenizer_init=True"
                )
            eos = [] if self.eos_token_id is None else [self.eos_token_id]
            self._structured_outputs = StructuredOutputManager(
                self.vllm_config.structured_outputs_config, self.tokenizer, self.vocab_size, eos
            )
        return self._structured_outputs

    def _compile_grammar(self, params: SamplingParams) -> CompiledGrammar | None:
        """The compiled grammar of a structured-output request, or None."""
        if params.structured_outputs is None:
            return None
        cfg = self.vllm_config
        if cfg.speculative_config is not None:
            # The verification path samples without the grammar's token mask.
            raise ValueError(
                "structured outputs are not supported by minivllm yet together with "
                "speculative decoding; start the engine without --speculative-config"
            )
        if cfg.parallel_config.world_size > 1:
            raise ValueError(
                "structured outputs are not supported by minivllm yet with tensor or "
                "pipeline parallelism; run the engine on one process"
            )
        return self.structured_outputs.grammar_for(params.structured_outputs)
