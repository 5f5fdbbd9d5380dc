"""The engine's side of pooling requests: their validation and their outputs.

A pooling request is a prompt and `PoolingParams`; it runs its prompt only (see
`minivllm.worker.pooling_runner`).  It may use the whole context: a prompt of
``max_model_len`` tokens is accepted (nothing is generated after it).

Long embedding inputs (vLLM's ``PoolerConfig.enable_chunked_processing``): the entry
points split an input longer than ``max_model_len`` into chunks (`embed_chunks`), run
each chunk as its own request, and merge the chunks' embeddings (`merge_chunks`):
their average weighted by token counts, normalized again when the request normalizes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.nn.functional as F

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
        start = params.token_type_start
        if start is not None and len(token_ids) > keep:
            cut = len(token_ids) - keep  # the pair's boundary moves with the kept tokens
            params.extra_kwargs = {
                **(params.extra_kwargs or {}),
                "compressed_token_type_ids": max(0, start - cut),
            }
        token_ids = token_ids[-keep:]
    if not token_ids:
        raise ValueError("the input is empty; give at least one token (a non-empty string)")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of vocabulary (size {vocab_size})")
    check_length(model_config, len(token_ids), task)
    return token_ids


def check_length(model_config: ModelConfig, num_tokens: int, task: str) -> None:
    """Refuse an input over ``max_embed_len`` (embeddings) or over the context."""
    if task == "embed":
        check_embed_len(model_config, num_tokens)
    max_len = model_config.max_model_len
    if num_tokens > max_len:
        hint = ""
        if task == "embed":
            hint = (
                ", or start the model with pooler_config "
                '{"enable_chunked_processing": true} to embed it in chunks'
            )
        raise ValueError(
            f"the input has {num_tokens} tokens, more than this model's maximum context "
            f"length of {max_len}; shorten it or set truncate_prompt_tokens{hint}"
        )


def check_embed_len(model_config: ModelConfig, num_tokens: int) -> None:
    """Refuse an embedding input over the pooler's ``max_embed_len``."""
    pooler = model_config.pooler_config
    assert pooler is not None
    if pooler.max_embed_len is not None and num_tokens > pooler.max_embed_len:
        raise ValueError(
            f"the input has {num_tokens} tokens, more than this model's maximum embedding "
            f"input length of {pooler.max_embed_len} (pooler_config.max_embed_len); shorten "
            "it or set truncate_prompt_tokens"
        )


def embed_chunks(
    model_config: ModelConfig, token_ids: list[int], params: PoolingParams
) -> list[list[int]]:
    """The requests an embedding input runs as: the input itself, or (chunked
    processing on, no truncation asked, longer than ``max_model_len``) its chunks of
    ``max_model_len`` tokens, the last one shorter.  ValueError over ``max_embed_len``."""
    pooler = model_config.pooler_config
    max_len = model_config.max_model_len
    chunked = pooler is not None and pooler.enable_chunked_processing
    if not chunked or params.truncate_prompt_tokens is not None or len(token_ids) <= max_len:
        return [token_ids]
    check_embed_len(model_config, len(token_ids))
    return [token_ids[i : i + max_len] for i in range(0, len(token_ids), max_len)]


def merge_chunks(
    outputs: list[PoolingRequestOutput],
    token_ids: list[int],
    params: PoolingParams,
    model_config: ModelConfig,
) -> PoolingRequestOutput:
    """One input's output from its chunks' outputs (vLLM's aggregation): each chunk's
    embedding weighted by its token count, averaged, then L2-normalized again when the
    request normalizes (an average of unit vectors is shorter than one)."""
    if len(outputs) == 1:
        return outputs[0]
    weights = [len(o.prompt_token_ids) for o in outputs]
    total = sum(o.outputs.data.float() * w for o, w in zip(outputs, weights, strict=True))
    data = total / sum(weights)
    normalize = params.normalize
    if normalize is None:
        assert model_config.pooler_config is not None
        normalize = bool(model_config.pooler_config.normalize)
    if normalize:
        data = F.normalize(data, p=2, dim=-1)
    cached = sum(o.num_cached_tokens for o in outputs)
    return PoolingRequestOutput(
        outputs[0].request_id, PoolingOutput(data), list(token_ids), True, cached
    )


def regroup_chunks(
    outputs: list[PoolingRequestOutput],
    counts: list[int],
    inputs: list[list[int]],
    params: list[PoolingParams],
    model_config: ModelConfig,
) -> list[PoolingRequestOutput]:
    """The outputs of inputs that ran as ``counts[i]`` chunk requests each, in order."""
    merged, start = [], 0
    for n, ids, p in zip(counts, inputs, params, strict=True):
        merged.append(merge_chunks(outputs[start : start + n], ids, p, model_config))
        start += n
    return merged


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
