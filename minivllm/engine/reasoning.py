"""The engine's side of reasoning models: the markers' token ids, found once with the
tokenizer before the workers start, and the checks of a request's
``thinking_token_budget`` (the worker's `ThinkingGate` enforces it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig
    from minivllm.sampling_params import SamplingParams


def init_reasoning_token_ids(vllm_config: VllmConfig, tokenizer: Any) -> None:
    """Tokenize the reasoning markers (ValueError if the engine has no tokenizer)."""
    reasoning = vllm_config.reasoning_config
    if reasoning is None:
        return
    if tokenizer is None:
        raise ValueError(
            "a reasoning parser needs the tokenizer to find its markers; drop "
            "skip_tokenizer_init or --reasoning-parser"
        )
    reasoning.initialize_token_ids(tokenizer)


def check_thinking_budget(vllm_config: VllmConfig, params: SamplingParams) -> None:
    """ValueError for a ``thinking_token_budget`` this engine cannot enforce."""
    if params.thinking_token_budget is None:
        return
    reasoning = vllm_config.reasoning_config
    if reasoning is None or not reasoning.enabled:
        raise ValueError(
            "thinking_token_budget needs a reasoning model: start the engine with "
            "--reasoning-parser (or --reasoning-start-str and --reasoning-end-str)"
        )
    if vllm_config.speculative_config is not None:
        raise ValueError(
            "thinking_token_budget is not supported by minivllm yet together with "
            "speculative decoding; start the engine without --speculative-config"
        )
    if vllm_config.parallel_config.world_size > 1:
        raise ValueError(
            "thinking_token_budget is not supported by minivllm yet with tensor or "
            "pipeline parallelism; run the engine on one process"
        )
