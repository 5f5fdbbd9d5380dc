"""`PoolerConfig` and the rules that pick a pooling model's runner, task and pooler.

vLLM's behaviour, decided from the checkpoint's architecture name:

- ``runner="auto"``: "pooling" for pooling-only architectures (``BertModel``,
  ``Qwen3Model``, ``*ForSequenceClassification``, ...), "generate" otherwise.
- ``convert="auto"`` (with the pooling runner): "classify" for
  ``*ForSequenceClassification`` (the checkpoint's score head), "embed" for
  everything else (a base ``*Model`` or a ``*ForCausalLM`` whose LM head is dropped).
- the default pooler: embedding models pool the LAST token of a causal decoder and
  the CLS token of an encoder (or what a sentence-transformers checkpoint's
  ``1_Pooling/config.json`` says), then L2-normalize; classifiers pool LAST (a
  decoder) or CLS (an encoder), apply the score head, then softmax (sigmoid for a
  single label).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from minivllm.config.utils import config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

PoolingType = Literal["LAST", "MEAN", "CLS", "ALL", "STEP"]
POOLING_TYPES: tuple[str, ...] = ("LAST", "MEAN", "CLS", "ALL")
"""Pooling types minivllm runs (vLLM's STEP, for process reward models, is refused)."""

ENCODER_ONLY_ARCHITECTURES: tuple[str, ...] = ("BertModel", "BertForSequenceClassification")
"""Bidirectional encoders: no causal mask, so no chunked prefill and no prefix cache."""

POOLING_ARCHITECTURES: tuple[str, ...] = (
    "BertModel",
    "BertForSequenceClassification",
    "LlamaModel",
    "Qwen2Model",
    "Qwen3Model",
    "LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification",
)
"""Architectures that only run with ``runner="pooling"``."""


@config
class PoolerConfig:
    """Controls the behaviour of output pooling in pooling models."""

    pooling_type: PoolingType | None = None
    """How the hidden states of a prompt become one output: "LAST" (last token),
    "MEAN" (average of all tokens), "CLS" (first token) or "ALL" (every token's
    hidden state). None: the model's default (LAST for a decoder, CLS for an
    encoder, or a sentence-transformers checkpoint's own)."""
    normalize: bool | None = None
    """L2-normalize embeddings. None: True for embedding models."""
    dimensions: int | None = None
    """Keep only the first ``dimensions`` values of every embedding (Matryoshka
    truncation), then normalize. At most the model's hidden size."""
    use_activation: bool | None = None
    """Apply the classifier's activation (softmax; sigmoid for one label) to its
    logits, or normalization to embeddings. None: True."""
    logit_bias: float | None = None
    """Subtracted from classification logits before the activation."""
    enable_chunked_processing: bool = False
    """Accept embedding inputs longer than ``max_model_len``: such an input is split
    into chunks of at most ``max_model_len`` tokens, each chunk is embedded as its own
    request (the model's pooling type within the chunk, then ``dimensions`` and
    normalization), and the chunks' embeddings are averaged weighted by their token
    counts, then normalized again when ``normalize`` is on.  Embedding requests
    (``LLM.embed``, ``/v1/embeddings``) only; without it an over-long input is refused."""
    max_embed_len: int | None = None
    """The longest embedding input accepted, in tokens.  With
    ``enable_chunked_processing``: the bound on what is split into chunks (None: no
    bound).  Without it: inputs are refused above ``min(max_embed_len,
    max_model_len)``."""
    step_tag_id: int | None = None
    """STEP pooling's tag token (process reward models). Not supported."""
    returned_token_ids: list[int] | None = None
    """STEP pooling's vocabulary slice (process reward models). Not supported."""

    def __post_init__(self) -> None:
        if self.pooling_type == "STEP" or self.step_tag_id is not None or self.returned_token_ids:
            raise ValueError(
                "pooler_config: STEP pooling (step_tag_id, returned_token_ids) is for "
                "process reward models, which minivllm does not run; use pooling_type "
                f"{', '.join(POOLING_TYPES)}"
            )
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooler_config.pooling_type={self.pooling_type!r} is unknown; use one of "
                f"{', '.join(POOLING_TYPES)}"
            )
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"pooler_config.dimensions must be >= 1, got {self.dimensions}")
        if self.max_embed_len is not None and self.max_embed_len < 1:
            raise ValueError(
                f"pooler_config.max_embed_len must be >= 1 (tokens), got {self.max_embed_len}"
            )

    def compute_hash(self) -> str:
        """The pooler runs after the compiled model: nothing here shapes the graph."""
        return hash_factors(get_hash_factors(self, set(vars(self))))


def is_pooling_only(architecture: str) -> bool:
    """Whether ``architecture`` has no LM head (runs only with the pooling runner)."""
    return architecture in POOLING_ARCHITECTURES


def default_runner(architectures: list[str]) -> str:
    """vLLM's ``runner="auto"``: pooling for pooling-only architectures."""
    return "pooling" if any(is_pooling_only(a) for a in architectures) else "generate"


def default_convert(architecture: str) -> str:
    """vLLM's ``convert="auto"`` under the pooling runner."""
    return "classify" if architecture.endswith("ForSequenceClassification") else "embed"


def sentence_transformers_pooling(model_dir: str) -> str | None:
    """The pooling type a sentence-transformers checkpoint declares (``1_Pooling``)."""
    path = Path(model_dir)
    modules = path / "modules.json"
    if not modules.is_file():
        return None
    for module in json.loads(modules.read_text()):
        if module.get("type", "").endswith(".Pooling"):
            cfg_file = path / module.get("path", "") / "config.json"
            if not cfg_file.is_file():
                return None
            cfg: dict[str, Any] = json.loads(cfg_file.read_text())
            return _pooling_mode(cfg)
    return None


_ST_MODES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
"""sentence-transformers' pooling modes that map onto minivllm's pooling types."""


def _pooling_mode(cfg: dict[str, Any]) -> str | None:
    """The pooling type of a sentence-transformers ``Pooling`` config, in its current
    form (``"pooling_mode": "mean"``) or its older one (``"pooling_mode_mean_tokens"``)."""
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        return _ST_MODES.get(mode)
    flags = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
    flags["pooling_mode_lasttoken"] = "lasttoken"
    return next((_ST_MODES[v] for k, v in flags.items() if cfg.get(k)), None)


def resolve_pooler_config(
    pooler: PoolerConfig | None,
    *,
    convert: str,
    encoder_only: bool,
    model_dir: str,
    hidden_size: int,
    gguf_pooling: str | None = None,
) -> PoolerConfig:
    """Fill the unset fields of ``pooler`` with the model's defaults; check dimensions."""
    pooler = PoolerConfig() if pooler is None else pooler
    if pooler.pooling_type is None:
        declared = gguf_pooling or sentence_transformers_pooling(model_dir)
        pooler.pooling_type = declared or ("CLS" if encoder_only else "LAST")  # type: ignore[assignment]
    if pooler.normalize is None:
        pooler.normalize = convert == "embed"
    if pooler.use_activation is None:
        pooler.use_activation = True
    if pooler.enable_chunked_processing and pooler.pooling_type == "ALL":
        raise ValueError(
            "pooler_config.enable_chunked_processing averages one embedding per chunk, but "
            "ALL pooling returns every token's state; use pooling_type MEAN, CLS or LAST, or "
            "drop enable_chunked_processing"
        )
    if pooler.dimensions is not None and pooler.dimensions > hidden_size:
        raise ValueError(
            f"pooler_config.dimensions={pooler.dimensions} is larger than the model's "
            f"hidden size {hidden_size}; use at most {hidden_size}"
        )
    return pooler


def apply_pooling_rules(cfg: VllmConfig, prefix_caching_by_user: bool) -> None:
    """What the pooling runner changes in the engine: an encoder runs each prompt whole
    (no chunked prefill: a token sees the tokens after it), and prefix caching stays off
    where pooling reads the hidden states of cached tokens (MEAN, CLS, ALL, encoders)."""
    model = cfg.model_config
    if model is None or model.runner_type != "pooling":
        return
    sched, cache = cfg.scheduler_config, cfg.cache_config
    if model.is_encoder_only and sched.enable_chunked_prefill:
        sched.enable_chunked_prefill = False
        assert sched.max_num_batched_tokens is not None
        if sched.max_num_batched_tokens < model.max_model_len:
            sched.max_num_batched_tokens = model.max_model_len
    if cache.enable_prefix_caching and not model.is_prefix_caching_supported:
        if prefix_caching_by_user:
            assert model.pooler_config is not None
            what = "an encoder" if model.is_encoder_only else model.pooler_config.pooling_type
            raise ValueError(
                f"prefix caching cannot serve this pooling model ({what} pooling reads the "
                "hidden states of every token, which cached blocks skip); drop "
                "--enable-prefix-caching (it is valid for causal models with LAST pooling)"
            )
        cache.enable_prefix_caching = False
