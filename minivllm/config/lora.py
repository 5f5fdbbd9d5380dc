"""`LoRAConfig`: serving LoRA adapters over one base model, several in one batch.

``max_loras`` adapters share a batch (each row gets its adapter's low-rank delta on
top of the base projections); up to ``max_cpu_loras`` loaded adapters stay cached
(least recently used beyond that are dropped and read again on demand).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

import torch

from minivllm.config.utils import config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig

MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
"""The ranks vLLM accepts for ``max_lora_rank``."""
LoRADType = Literal["auto", "float16", "bfloat16"]
"""The adapter dtypes vLLM accepts by name ("auto": the model's)."""
LORA_TARGET_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""The projections minivllm serves adapters on (merged q/k/v and gate/up)."""


@config
class LoRAConfig:
    """Configuration for LoRA."""

    max_lora_rank: int = 16
    """Largest adapter rank served; one of vLLM's values 1, 8, 16, 32, 64, 128, 256, 320,
    512.  An adapter of a higher rank is refused when it is loaded."""
    max_loras: int = 1
    """Most distinct adapters in one batch (>= 1); requests for further adapters wait
    until a running adapter's requests finish."""
    fully_sharded_loras: bool = False
    """Under tensor parallelism, shard the adapters' shrink too: by default the ranks of
    a column-parallel layer (q/k/v, gate/up) each hold the whole A and their rows of B;
    with this on each holds ``max_lora_rank / tensor_parallel_size`` rows of A and the
    shrunk activations are all-gathered (row-parallel layers likewise split B's output
    and all-reduce the shrunk activations).  Less adapter memory per rank, one more
    collective per layer; faster at high ranks or many ranks.  One process: no effect."""
    max_cpu_loras: int | None = None
    """Most adapters kept loaded in host memory (least recently used dropped beyond it);
    must be >= ``max_loras``.  None: ``max_loras``."""
    lora_dtype: torch.dtype | LoRADType = "auto"
    """Dtype of the adapter weights ("auto": the model's dtype; a quantized base keeps
    its low-bit weights and the adapter computes in this dtype)."""
    target_modules: list[str] | None = None
    """Serve adapters only on these module suffixes (e.g. ``["o_proj", "qkv_proj"]``);
    None: every supported projection (qkv_proj, o_proj, gate_up_proj, down_proj)."""
    default_mm_loras: dict[str, str] | None = None
    """Adapter applied per modality by default (multimodal models only; minivllm serves
    LoRA on text models, so it must stay None)."""

    def __post_init__(self) -> None:
        ranks = get_args(MaxLoRARanks)
        if self.max_lora_rank not in ranks:
            raise ValueError(
                f"max_lora_rank ({self.max_lora_rank}) must be one of {list(ranks)}; pick "
                "the smallest that covers your adapters' rank (--max-lora-rank)."
            )
        if self.max_loras < 1:
            raise ValueError(f"max_loras ({self.max_loras}) must be >= 1 (--max-loras).")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                f"({self.max_loras}); raise --max-cpu-loras or lower --max-loras."
            )
        self._check_names()

    def _check_names(self) -> None:
        unknown = sorted(set(self.target_modules or ()) - set(LORA_TARGET_MODULES))
        if unknown:
            raise ValueError(
                f"target_modules {unknown} are not LoRA modules minivllm serves; choose "
                f"among {list(LORA_TARGET_MODULES)}."
            )
        if self.default_mm_loras:
            raise ValueError(
                "default_mm_loras applies to multimodal models, and minivllm serves LoRA "
                "on text models only; drop it."
            )

    @property
    def served_modules(self) -> tuple[str, ...]:
        """The module suffixes that get LoRA layers."""
        wanted = self.target_modules
        return tuple(m for m in LORA_TARGET_MODULES if wanted is None or m in wanted)

    def verify_with_model_config(self, model_config: ModelConfig | None) -> None:
        """Resolve ``lora_dtype`` ("auto": the model's dtype; a name: that torch dtype)."""
        if self.lora_dtype == "auto":
            if model_config is not None:
                self.lora_dtype = model_config.dtype
        elif isinstance(self.lora_dtype, str):
            self.lora_dtype = getattr(torch, self.lora_dtype)

    def verify_with_parallel_config(self, tensor_parallel_size: int) -> None:
        """``fully_sharded_loras`` splits ``max_lora_rank`` evenly over the TP ranks."""
        if self.fully_sharded_loras and self.max_lora_rank % tensor_parallel_size:
            raise ValueError(
                f"fully_sharded_loras splits each adapter's rank over the tensor-parallel "
                f"ranks, and max_lora_rank ({self.max_lora_rank}) is not divisible by "
                f"tensor_parallel_size ({tensor_parallel_size}); raise --max-lora-rank or "
                "drop --fully-sharded-loras."
            )

    def compute_hash(self) -> str:
        """Ranks, slots, sharding, dtype and target modules shape the LoRA layers; the
        host-side cache size does not."""
        ignored = {"max_cpu_loras", "default_mm_loras"}
        return hash_factors(get_hash_factors(self, ignored))
