"""`SpeculativeConfig`: speculative decoding. Not supported by minivllm.

The fields and predicates `VllmConfig` reads exist so a configuration written
for vLLM parses, and so the error says what is missing.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

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


@config
class SpeculativeConfig(UnsupportedFeature):
    """Configuration for speculative decoding."""

    FEATURE: ClassVar[str] = "speculative decoding (speculative_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    method: SpeculativeMethod | None = None
    """How draft tokens are proposed."""
    model: str | None = None
    """Draft model (for draft-model and EAGLE methods)."""
    num_speculative_tokens: int | None = None
    """Draft tokens proposed per step."""
    num_speculative_tokens_per_batch_size: dict[int, int] | None = None
    """Dynamic speculation: draft length per batch size."""
    draft_tensor_parallel_size: int | None = None
    """Tensor-parallel size of the draft model."""
    quantization: str | None = None
    """Quantization of the draft model."""
    max_model_len: int | None = None
    """Context length of the draft model."""
    prompt_lookup_max: int | None = None
    """Longest n-gram matched by the n-gram proposer."""
    prompt_lookup_min: int | None = None
    """Shortest n-gram matched by the n-gram proposer."""
    disable_padded_drafter_batch: bool = False
    """Do not pad the drafter's batch (incompatible with async scheduling)."""
    parallel_drafting: bool = False
    """Propose all draft tokens in one forward pass."""
    enable_adaptive_verification: bool = False
    """Decide on the GPU how many draft tokens to verify."""
    draft_sample_method: Literal["probabilistic", "greedy"] = "probabilistic"
    """How the drafter samples."""
    rejection_sample_method: Literal["standard", "relaxed"] = "standard"
    """How draft tokens are accepted."""
    draft_model_config: Any = None
    """`ModelConfig` of the draft model (filled in by vLLM)."""
    target_model_config: Any = None
    """`ModelConfig` of the target model (filled in by vLLM)."""

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp", "deepseek_mtp", "qwen3_next_mtp")

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
        """Extra KV slots the drafter writes per request and step."""
        return self.num_speculative_tokens or 0

    def compute_hash(self) -> str:
        """The drafting method and length shape the verification graph."""
        ignored = {"draft_model_config", "target_model_config"}
        return hash_factors(get_hash_factors(self, ignored))
