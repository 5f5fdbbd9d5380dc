"""The engine's side of pooling requests: their validation and their outputs.

A pooling request is a prompt and `PoolingParams`; it runs its prompt only (see
`minivllm.worker.pooling_runner`).  It may use the whole context: a prompt of
``max_model_len`` tokens is accepted (nothing is generated after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minivllm.model_executor.layers.pooler import finish_pooled
from minivllm.outputs import PoolingOutput, PoolingRequestOutput

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.pooling_params import PoolingParams


def check_pooling_request(
    model_config: ModelConfig,
    token_ids: list[int],
    params: PoolingParams,
    task: str,
    vocab_size: int,
) -> list[int]:
    """Check a pooling request against the model (filling ``params``' defaults);
    returns its token ids, truncated as ``truncate_prompt_tokens`` asks."""
    if model_config.runner_type != "pooling":
        raise ValueError(
            f"this model runs text generation, so it cannot serve {task!r} requests; start "
            "it as a pooling model with --runner pooling (LLM(..., runner='pooling'))"
        )
    pooler = model_config.pooler_config
    assert pooler is not None
    params.verify(task, model_config.convert_type, pooler, model_config.hidden_size)
    max_len = model_config.max_model_len
    keep = params.truncate_prompt_tokens
    if keep is not None:
        if keep == -1:
            keep = max_len
        if not 1 <= keep <= max_len:
            raise ValueError(
                f"truncate_prompt_tokens={keep} is out of range; use -1 or 1 to {max_len}"
            )
        token_ids = token_ids[-keep:]
    if not token_ids:
        raise ValueError("the input is empty; give at least one token (a non-empty string)")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of vocabulary (size {vocab_size})")
    if len(token_ids) > max_len:
        raise ValueError(
            f"the input has {len(token_ids)} tokens, more than this model's maximum context "
            f"length of {max_len}; shorten it or set truncate_prompt_tokens"
        )
    return token_ids


def make_pooling_output(
    request_id: str,
    pooled: Any,
    params: PoolingParams,
    model_config: ModelConfig,
    prompt_token_ids: list[int],
    num_cached_tokens: int,
) -> PoolingRequestOutput:
    """The request's `PoolingRequestOutput` from the runner's pooled tensor."""
    pooler = model_config.pooler_config
    assert pooler is not None
    data = finish_pooled(pooled, params, model_config.convert_type, pooler.logit_bias)
    return PoolingRequestOutput(
        request_id, PoolingOutput(data), prompt_token_ids, True, num_cached_tokens
    )
