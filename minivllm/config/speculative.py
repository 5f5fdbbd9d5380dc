"""`SpeculativeConfig`: speculative decoding (draft tokens verified by the target model).

minivllm runs two proposers: ``ngram`` (prompt lookup: the tokens that followed the
latest earlier occurrence of the context's last n-gram) and ``draft_model`` (a smaller
model with the target's tokenizer, run autoregressively with its own KV cache).  The
other methods vLLM names parse, and are refused with the reason.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from minivllm.config.utils import config, get_hash_factors, hash_factors

MTPModelTypes = Literal["mtp", "deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp"]
EagleModelTypes = Literal["eagle", "eagle3", "mtp", "deepseek_mtp", "qwen3_next_mtp"]
NgramGPUTypes = Literal["ngram_gpu"]
SpeculativeMethod = Literal[
    "ngram",
    "ngram_gpu",
    "eagle",
    "eagle3",
    "mtp",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "dflash",
    "dspark",
    "custom_class",
]
SUPPORTED_METHODS = ("ngram", "draft_model")

DEFAULT_PROMPT_LOOKUP = 5
"""vLLM's n-gram window when neither bound is given."""


@config
class SpeculativeConfig:
    """Configuration for speculative decoding."""

    FEATURE: ClassVar[str] = "speculative decoding (speculative_config)"

    method: SpeculativeMethod | None = None
    """How draft tokens are proposed: "ngram" (prompt lookup) or "draft_model". None:
    "ngram" when ``model`` is "ngram" (or unset), "draft_model" when a model is named."""
    model: str | None = None
    """The draft model (a path, or a model name minivllm can load) for "draft_model";
    "ngram" selects the n-gram proposer."""
    num_speculative_tokens: int | None = None
    """Draft tokens proposed and verified per step (required, >= 1)."""
    num_speculative_tokens_per_batch_size: dict[int, int] | None = None
    """Dynamic speculation: draft length per batch size (not supported by minivllm)."""
    draft_tensor_parallel_size: int | None = None
    """Tensor-parallel size of the draft model (1 only: minivllm runs one worker)."""
    quantization: str | None = None
    """Quantization of the draft model (None only: the draft loads like the target)."""
    max_model_len: int | None = None
    """Context length of the draft model; None: the target's.  Speculation stops for a
    request whose context would pass it."""
    prompt_lookup_max: int | None = None
    """Longest n-gram the n-gram proposer matches (None: ``prompt_lookup_min``, or 5)."""
    prompt_lookup_min: int | None = None
    """Shortest n-gram the n-gram proposer matches (None: ``prompt_lookup_max``, or 5)."""
    disable_by_batch_size: int | None = None
    """Speculate only while fewer requests than this are running or waiting (>= 2);
    None: always.  Large batches are compute-bound, where verifying drafts costs
    more than it saves."""
    disable_padded_drafter_batch: bool = False
    """Do not pad the drafter's batch (minivllm's drafter never pads, so either value
    behaves the same)."""
    parallel_drafting: bool = False
    """Propose all draft tokens in one forward pass (not supported by minivllm)."""
    enable_adaptive_verification: bool = False
    """Decide on the GPU how many draft tokens to verify (not supported by minivllm)."""
    draft_sample_method: Literal["probabilistic", "greedy"] = "probabilistic"
    """How the draft model picks its tokens for random (temperature > 0) requests:
    "probabilistic" samples from the draft's distribution, "greedy" takes its argmax.
    Greedy requests always draft greedily.  Either way rejection sampling keeps the
    target's distribution."""
    rejection_sample_method: Literal["standard", "relaxed"] = "standard"
    """How draft tokens are accepted: "standard" (exact rejection sampling) only."""
    draft_model_config: Any = None
    """`ModelConfig` of the draft model (filled in by minivllm for "draft_model")."""
    target_model_config: Any = None
    """`ModelConfig` of the target model (filled in by minivllm)."""

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = "ngram" if self.model in (None, "ngram", "[ngram]") else "draft_model"
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(
                f"speculative method {self.method!r} is not supported by minivllm yet; "
                f"use one of {', '.join(SUPPORTED_METHODS)}."
            )
        if self.num_speculative_tokens is None or self.num_speculative_tokens < 1:
            raise ValueError(
                "speculative_config needs num_speculative_tokens >= 1 (the draft tokens "
                f"per step), got {self.num_speculative_tokens!r}; set e.g. 3."
            )
        if self.method == "ngram":
            self._init_ngram()
        elif self.model is None or self.model == "ngram":
            raise ValueError(
                "speculative method 'draft_model' needs the draft model: set "
                "speculative_config.model to a model with the target's tokenizer."
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 2:
            raise ValueError(
                f"disable_by_batch_size must be >= 2, got {self.disable_by_batch_size}; "
                "leave it unset to always speculate."
            )
        refused = {
            "num_speculative_tokens_per_batch_size": self.num_speculative_tokens_per_batch_size
            is not None,
            "draft_tensor_parallel_size": self.draft_tensor_parallel_size not in (None, 1),
            "quantization": self.quantization is not None,
            "parallel_drafting": self.parallel_drafting,
            "enable_adaptive_verification": self.enable_adaptive_verification,
            "rejection_sample_method": self.rejection_sample_method != "standard",
        }
        for name, bad in refused.items():
            if bad:
                raise ValueError(
                    f"speculative_config.{name}={getattr(self, name)!r} is not supported by "
                    "minivllm yet; leave it at its default."
                )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"speculative max_model_len must be >= 1, got {self.max_model_len}.")

    def _init_ngram(self) -> None:
        self.model = "ngram"
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        assert lo is not None and hi is not None
        if lo < 1:
            raise ValueError(f"prompt_lookup_min must be >= 1, got {lo}.")
        if hi < lo:
            raise ValueError(
                f"prompt_lookup_max ({hi}) must be >= prompt_lookup_min ({lo}); raise it."
            )
        self.prompt_lookup_min, self.prompt_lookup_max = lo, hi

    def check_supported(self) -> None:
        """Everything __post_init__ accepted runs."""

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp", "deepseek_mtp", "qwen3_next_mtp")

    def use_ngram(self) -> bool:
        return self.method == "ngram"

    def use_dflash(self) -> bool:
        return self.method == "dflash"

    def use_dspark(self) -> bool:
        return self.method == "dspark"

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    def use_multi_module_mtp(self) -> bool:
        return False

    def uses_dynamic_speculative_decoding(self) -> bool:
        return self.num_speculative_tokens_per_batch_size is not None

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Extra KV slots the drafter writes per request and step (a draft model writes
        the KV of its own drafts past the verified tokens; n-gram lookup writes none)."""
        return self.num_speculative_tokens or 0 if self.uses_draft_model() else 0

    def compute_hash(self) -> str:
        """The drafting method and length shape the verification graph."""
        ignored = {"draft_model_config", "target_model_config"}
        return hash_factors(get_hash_factors(self, ignored))

    def summary(self) -> str:
        """One line for the start-up log: the method, draft length and its proposer."""
        line = f"method {self.method}, num_speculative_tokens={self.num_speculative_tokens}"
        if self.method == "ngram":
            return f"{line}, n-grams of {self.prompt_lookup_min}-{self.prompt_lookup_max} tokens"
        return f"{line}, draft model {self.model}"

    def __repr__(self) -> str:
        return (
            f"SpeculativeConfig(method={self.method!r}, model={self.model!r}, "
            f"num_spec_tokens={self.num_speculative_tokens})"
        )
