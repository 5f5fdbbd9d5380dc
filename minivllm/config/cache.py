"""`CacheConfig`: the paged KV cache (block size, memory budget, dtype, prefix caching)."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, get_args

from minivllm.config.utils import config, hash_factors
from minivllm.logger import init_logger

if TYPE_CHECKING:
    import torch

    from minivllm.config.parallel import ParallelConfig

logger = init_logger(__name__)

GiB_bytes = 1 << 30

BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]
CacheDType = Literal[
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4",
    "nvfp4_ds_mla",
]
# The subset minivllm's KV cache can store; the rest are vLLM names for
# hardware-specific (Gaudi) or MLA-only layouts.
SUPPORTED_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
MambaDType = Literal["auto", "float32", "float16"]
MambaCacheMode = Literal["none", "all", "align"]
PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor"]
KVOffloadingBackend = Literal["native", "lmcache"]


def get_cpu_memory() -> int:
    """Total host memory in bytes (a function so tests can replace it)."""
    import psutil

    return int(psutil.virtual_memory().total)


@config
class CacheConfig:
    """Configuration for the KV cache."""

    block_size: int | None = None
    """Number of tokens in one KV cache block, one of 1, 8, 16, 32, 64, 128, 256.
    No static default: when left unset, the platform fills it in while the
    `VllmConfig` is resolved (16 on CPU and CUDA)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the device memory (0 < x <= 1) this engine instance may use
    for weights, activations and KV cache. It is a per-instance limit: two
    instances sharing one GPU can each be given 0.5."""
    swap_space: float = 4
    """CPU swap space per GPU, in GiB. Checked against host memory: above 40%
    of it a warning is logged, above 70% it is an error."""
    cache_dtype: CacheDType = "auto"
    """Data type of the KV cache. "auto" uses the model dtype; "fp8" (an alias of
    "fp8_e4m3") and "fp8_e5m2" halve the cache size at some accuracy cost.
    "fp8_inc", "fp8_ds_mla", "nvfp4" and "nvfp4_ds_mla" are vLLM layouts minivllm
    does not implement and are refused."""
    is_attention_free: bool = False
    """Whether the model has no attention layers. Copied from `ModelConfig`."""
    num_gpu_blocks_override: int | None = None
    """Use exactly this many device KV blocks instead of the number derived from
    the memory budget (handy for testing preemption). Ignored when None."""
    sliding_window: int | None = None
    """Sliding-window size of the model's attention. Copied from `ModelConfig`."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes across requests."""
    prefix_caching_hash_algo: PrefixCachingHashAlgo = "sha256"
    """How block hashes for prefix caching are computed:
    "sha256" hashes a pickle of the block's tokens and parent hash;
    "sha256_cbor" hashes canonical CBOR instead, which is reproducible across
    processes and languages."""
    prefix_cache_retention_interval: int | None = 0
    """Tokens between the prefix-cache checkpoints vLLM keeps for sliding-window (and
    Mamba) layers; 0 keeps only the boundaries a later request can resume from (the
    end of a prompt, where prompts diverge), None keeps every full block.  It thins
    out what such layers leave in the cache so that their short-lived blocks do not
    crowd out other prompts' prefixes.  minivllm keeps every full block of its
    sliding-window layers, which is None; 0 is accepted as the default (on models
    without sliding windows there is nothing to thin out, in vLLM either), a positive
    interval is refused."""
    cpu_offload_gb: float = 0
    """GiB of model weights to keep in CPU memory per GPU and stream in on each
    forward pass. Must be >= 0; minivllm does not offload weights, so only 0 is
    accepted."""
    calculate_kv_scales: bool = False
    """With an fp8 KV cache, compute `k_scale`/`v_scale` from the data instead of
    loading them from the checkpoint (or using 1.0)."""
    cpu_kvcache_space_bytes: int | None = None
    """(CPU only) bytes of host memory for the KV cache. None lets the worker
    choose from the available memory."""
    mamba_page_size_padded: int | None = None
    """Override of the Mamba state page size (hybrid models only; unsupported)."""
    mamba_cache_dtype: MambaDType = "auto"
    """Data type of the Mamba conv and SSM state ("auto" = from the model).
    minivllm runs no Mamba layers, so only "auto" is accepted."""
    mamba_ssm_cache_dtype: MambaDType = "auto"
    """Data type of the Mamba SSM state alone ("auto" = `mamba_cache_dtype`).
    Only "auto" is accepted."""
    mamba_cache_mode: MambaCacheMode = "none"
    """How Mamba states are cached for prefix caching. Only "none" is accepted."""
    mamba_block_size: int | None = None
    """Block size of the Mamba state cache (hybrid models only; unsupported)."""
    use_replayssm: bool = False
    """Use the ReplaySSM kernels for Mamba speculative decoding (unsupported)."""
    use_kda_recoverssm: bool = False
    """Derived by `VllmConfig` from `use_replayssm` (KDA models); stays False here."""
    replayssm_buffer_len: int = 16
    """Length of the ReplaySSM replay buffer (only read when `use_replayssm`)."""
    kv_sharing_fast_prefill: bool = False
    """Let KV-sharing layers (YOCO-style, e.g. Gemma3n) skip prompt tokens. Work in
    progress in vLLM too: it only changes attention metadata, not speed."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size per device in bytes. When set, `gpu_memory_utilization` is
    ignored for sizing the cache."""
    kv_offloading_size: float | None = None
    """GiB of the second KV tier that blocks evicted from the KV pool go to and come
    back from on a prefix hit (None: no offloading).  It resolves into a
    `KVTransferConfig` with the OffloadingConnector (native backend)."""
    kv_offloading_backend: KVOffloadingBackend = "native"
    """Backend that offloads KV blocks when `kv_offloading_size` is set: "native"
    (minivllm's OffloadingConnector); "lmcache" is refused (LMCache does not run here)."""

    # Filled in after memory profiling.
    num_gpu_blocks: int | None = field(default=None, init=False)
    """Number of KV blocks allocated on the device (set by the worker)."""
    num_cpu_blocks: int | None = field(default=None, init=False)
    """Number of KV blocks allocated in host memory (set by the worker)."""

    def __post_init__(self) -> None:
        self.swap_space_bytes = int(self.swap_space * GiB_bytes)
        self._verify_args()
        self.check_supported()
        self._verify_cache_dtype()
        self._verify_prefix_caching()

    def compute_hash(self) -> str:
        """Hash of the fields that change the compiled graph.

        Only the cache and Mamba state dtypes do; sizes, memory budgets and
        prefix caching are runtime choices. (`cpu_offload_gb` is not part of a
        compiled graph either.)
        """
        factors = {
            "cache_dtype": self.cache_dtype,
            "mamba_cache_dtype": self.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": self.mamba_ssm_cache_dtype,
        }
        return hash_factors(factors)

    def metrics_info(self) -> dict[str, str]:
        """Every attribute as a string, for the Prometheus ``cache_config_info`` gauge."""
        return {k: str(v) for k, v in self.__dict__.items() if not k.startswith("_")}

    def _verify_args(self) -> None:
        if self.cpu_offload_gb < 0:
            raise ValueError(
                f"cpu_offload_gb must be non-negative, got {self.cpu_offload_gb}; use 0"
            )
        if not 0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                "gpu_memory_utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization}; e.g. 0.9 uses 90% of device memory"
            )
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be non-negative GiB, got {self.swap_space}")
        allowed = get_args(BlockSize)
        if self.block_size is not None and self.block_size not in allowed:
            raise ValueError(f"block_size must be one of {list(allowed)}, got {self.block_size}")
        interval = self.prefix_cache_retention_interval
        if interval is not None and interval < 0:
            raise ValueError(
                f"prefix_cache_retention_interval must be >= 0 or None, got {interval}; "
                "use 0 (the default) or None"
            )
        if self.kv_offloading_size is not None and self.kv_offloading_size <= 0:
            raise ValueError(
                f"kv_offloading_size must be a positive number of GiB, got "
                f"{self.kv_offloading_size}; leave it unset to turn offloading off"
            )
        if self.kv_offloading_backend not in get_args(KVOffloadingBackend):
            raise ValueError(
                f"kv_offloading_backend must be one of {list(get_args(KVOffloadingBackend))}, "
                f"got {self.kv_offloading_backend!r}"
            )
        for name in ("num_gpu_blocks_override", "cpu_kvcache_space_bytes", "kv_cache_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive when set, got {value}")

    def _verify_cache_dtype(self) -> None:
        if self.cache_dtype == "auto":
            return
        if self.cache_dtype not in get_args(CacheDType):
            raise ValueError(
                f"Unknown kv cache dtype: {self.cache_dtype!r}; choose one of "
                f"{list(SUPPORTED_CACHE_DTYPES)}"
            )
        if self.cache_dtype.startswith("fp8"):
            logger.info(
                "Storing the KV cache in %s: it halves the cache footprint but may cost "
                "accuracy without proper scaling factors.",
                self.cache_dtype,
            )

    def _verify_prefix_caching(self) -> None:
        # Sliding-window models may use prefix caching here (as in vLLM V1),
        # so only the hash algorithm is checked.
        if self.enable_prefix_caching and self.prefix_caching_hash_algo not in get_args(
            PrefixCachingHashAlgo
        ):
            raise ValueError(
                f"Unknown prefix caching hash algorithm: {self.prefix_caching_hash_algo!r}. "
                f"Must be one of {list(get_args(PrefixCachingHashAlgo))}."
            )

    def unsupported_settings(self) -> list[str]:
        """Human-readable list of settings minivllm cannot honour."""
        problems: list[str] = []
        if self.cache_dtype not in SUPPORTED_CACHE_DTYPES:
            problems.append(
                f"cache_dtype={self.cache_dtype!r} (use one of {list(SUPPORTED_CACHE_DTYPES)})"
            )
        if self.cpu_offload_gb > 0:
            problems.append(f"cpu_offload_gb={self.cpu_offload_gb} (weight offloading; use 0)")
        if self.prefix_cache_retention_interval:
            problems.append(
                f"prefix_cache_retention_interval={self.prefix_cache_retention_interval} "
                "(minivllm keeps every full sliding-window block in the prefix cache and "
                "cannot thin them out; use 0 or None)"
            )
        mamba_defaults: dict[str, Any] = {
            "mamba_page_size_padded": None,
            "mamba_cache_dtype": "auto",
            "mamba_ssm_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_block_size": None,
            "use_replayssm": False,
        }
        for name, default in mamba_defaults.items():
            if getattr(self, name) != default:
                problems.append(f"{name}={getattr(self, name)!r} (Mamba models)")
        return problems

    def check_supported(self) -> None:
        """Raise ``ValueError`` naming every setting minivllm cannot honour."""
        problems = self.unsupported_settings()
        if problems:
            raise ValueError(
                "CacheConfig settings not supported by minivllm: "
                + "; ".join(problems)
                + ". Leave them at their defaults."
            )

    def verify_with_parallel_config(self, parallel_config: ParallelConfig) -> None:
        """Check the swap space against host memory (all GPUs of a node share it)."""
        total_cpu_memory = get_cpu_memory()
        # Assumes the tensor-parallel group lives on one node.
        num_gpus_per_node = parallel_config.tensor_parallel_size
        cpu_memory_usage = self.swap_space_bytes * num_gpus_per_node
        msg = (
            f"{cpu_memory_usage / GiB_bytes:.2f} GiB out of the "
            f"{total_cpu_memory / GiB_bytes:.2f} GiB total CPU memory is allocated for "
            "the swap space."
        )
        if cpu_memory_usage > 0.7 * total_cpu_memory:
            raise ValueError(f"Too large swap space. {msg} Lower swap_space.")
        if cpu_memory_usage > 0.4 * total_cpu_memory:
            logger.warning("Possibly too large swap space. %s", msg)

    def resolve_kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The torch dtype KV blocks are stored in for a model computing in ``model_dtype``."""
        import torch

        if self.cache_dtype == "auto":
            return model_dtype
        mapping = {
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
            "fp8": torch.float8_e4m3fn,
            "fp8_e4m3": torch.float8_e4m3fn,
            "fp8_e5m2": torch.float8_e5m2,
        }
        if self.cache_dtype not in mapping:
            self.check_supported()
        return mapping[self.cache_dtype]
