"""`ParallelConfig`: how the model is split over processes.

minivllm runs tensor and pipeline parallelism over ``torch.distributed`` with
the multiprocessing ("mp") or Ray ("ray") executor, and data parallelism as
``data_parallel_size`` engine replicas behind one front end (processes or Ray
actors, see `minivllm.engine.dp_client`), or one replica per server behind an
external load balancer (``data_parallel_rank``).  Context and expert parallelism
keep their vLLM fields but any size above 1 is refused.

vLLM's other fields (multi-node ``nnodes``/``master_addr``, NUMA binding, Ray,
data-parallel ports, ...) are fields here too, so vLLM configs and flags parse:
left at vLLM's defaults they change nothing; any other value is refused with
"not supported by minivllm yet". Fields vLLM takes only from Python (``eplb_config``,
``placement_group``, ...) are refused the same way when given.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import model_validator
from pydantic_core import ArgsKwargs

from minivllm.config.utils import config, hash_factors
from minivllm.logger import init_logger

logger = init_logger(__name__)

DistributedExecutorBackend = Literal["uni", "mp", "ray", "external_launcher"]
SUPPORTED_EXECUTOR_BACKENDS = ("uni", "mp", "ray")
"""Executor names minivllm has (single process, multiprocessing, Ray)."""
All2AllBackend = Literal[
    "allgather_reducescatter",
    "naive",
    "pplx",
    "deepep_low_latency",
    "deepep_high_throughput",
    "nixl_ep",
    "moonep",
    "flashinfer_all2allv",
]
ExpertPlacementStrategy = Literal["linear", "round_robin"]
DCPCommBackend = Literal["ag_rs", "a2a"]

DataParallelBackend = Literal["mp", "ray"]
"""How data-parallel replicas are launched: local processes or Ray actors."""

VLLM_ONLY_FIELDS: dict[str, str] = {
    "data_parallel_rank_local": "data parallelism",
    "data_parallel_hybrid_lb": "data-parallel load balancing",
    "enable_ep_weight_filter": "expert parallelism",
    "enable_elastic_ep": "elastic expert parallelism",
    "dbo_decode_token_threshold": "dual batch overlap",
    "dbo_prefill_token_threshold": "dual batch overlap",
    "ray_workers_use_nsight": "Ray workers",
    "sd_worker_cls": "custom workers",
    "worker_extension_cls": "worker extensions",
    "numa_bind": "NUMA binding",
    "numa_bind_nodes": "NUMA binding",
    "numa_bind_cpus": "NUMA binding",
    "assigned_physical_gpu_ids": "GPU id remapping",
    "distributed_timeout_seconds": "distributed timeouts",
    "cpu_distributed_timeout_seconds": "distributed timeouts",
}
"""vLLM fields of `ParallelConfig` minivllm keeps at vLLM's default -> what they are for."""

VLLM_PYTHON_ONLY: dict[str, str] = {
    "eplb_config": "expert load balancing",
    "ray_runtime_env": "Ray workers",
    "placement_group": "Ray workers",
    "fault_tolerance_config": "fault tolerance",
}
"""vLLM fields set only from Python (objects, not flags); refused unless None or empty."""


@config
class ParallelConfig:
    """Configuration for the distributed execution."""

    pipeline_parallel_size: int = 1
    """Number of pipeline stages: the decoder layers are split evenly over them (needs
    the "mp" or "ray" executor when > 1)."""
    tensor_parallel_size: int = 1
    """Number of tensor-parallel ranks (needs the "mp" or "ray" executor when > 1)."""
    prefill_context_parallel_size: int = 1
    """Prefill context-parallel ranks. Only 1 is supported."""
    decode_context_parallel_size: int = 1
    """Decode context-parallel ranks. Only 1 is supported."""
    dcp_kv_cache_interleave_size: int = 1
    """Tokens stored per DCP rank before moving to the next (deprecated alias of
    ``cp_kv_cache_interleave_size``)."""
    cp_kv_cache_interleave_size: int = 1
    """Tokens stored per context-parallel rank before moving to the next."""
    dcp_comm_backend: DCPCommBackend = "ag_rs"
    """Communication pattern of decode context parallelism."""
    data_parallel_size: int = 1
    """Number of data-parallel replicas: each is a whole engine (scheduler, executor,
    KV cache; itself TP/PP when asked) with its share of the cores, and the front end
    sends each request to the least loaded one."""
    data_parallel_size_local: int = 1
    """Data-parallel replicas on this node.  1 with ``data_parallel_size`` > 1 means
    all of them (the "mp" backend runs every replica here; Ray places them)."""
    data_parallel_rank: int = 0
    """Rank of this replica.  Given on the command line it means external load
    balancing: this server runs replica ``data_parallel_rank`` only (needs
    ``--data-parallel-address``)."""
    data_parallel_index: int = 0
    """Index of this replica (the rank, without the process-group meaning)."""
    data_parallel_external_lb: bool = False
    """Whether an external load balancer spreads requests over replicas."""
    data_parallel_backend: DataParallelBackend = "mp"
    """How data-parallel replicas are launched: "mp" (one process each on this
    machine) or "ray" (one Ray actor each, on the cluster's nodes)."""
    data_parallel_prefix_aware_routing: bool = False
    """Send a request to the replica that already holds the longest part of its
    prompt in its prefix cache, when that replica's load is within
    ``data_parallel_prefix_routing_slack`` of the least loaded one (minivllm's; vLLM
    always picks the least loaded)."""
    data_parallel_prefix_routing_slack: int = 8
    """How much more load (``waiting * 4 + running``) prefix-aware routing accepts
    on a replica for a prefix hit."""
    enable_expert_parallel: bool = False
    """Shard MoE experts over ranks. Unsupported."""
    enable_eplb: bool = False
    """Expert-parallel load balancing. Unsupported."""
    expert_placement_strategy: ExpertPlacementStrategy = "linear"
    """How experts are placed on ranks (MoE only)."""
    all2all_backend: All2AllBackend = "allgather_reducescatter"
    """All-to-all kernel for expert parallelism (MoE only)."""
    enable_dbo: bool = False
    """Dual batch overlap (micro-batching). Unsupported."""
    ubatch_size: int = 0
    """Micro-batches per step; > 1 turns on micro-batching. Unsupported."""
    disable_custom_all_reduce: bool = False
    """Use torch.distributed's all-reduce instead of a custom kernel. minivllm
    always uses torch.distributed, so this has no effect."""
    disable_nccl_for_dp_synchronization: bool | None = None
    """Synchronize data-parallel ranks over Gloo instead of NCCL. None lets
    `VllmConfig` decide (from async scheduling)."""
    enable_batch_sharded_sampling: bool | None = None
    """Shard sampling by request over tensor-parallel ranks. Unsupported;
    `VllmConfig` resolves None to False."""
    enable_fault_tolerance: bool = False
    """Detect and survive failed peers. Unsupported."""
    distributed_executor_backend: DistributedExecutorBackend | None = None
    """Executor: "uni" (one process), "mp" (one process per rank) or "ray".
    None: "uni" for one rank, "mp" otherwise."""
    max_parallel_loading_workers: int | None = None
    """Load weights in batches of this many workers (no effect in minivllm)."""
    worker_cls: str = "auto"
    """Qualified name of the worker class; only "auto" is supported."""
    rank: int = 0
    """Global rank of this process (set by the executor)."""
    is_moe_model: bool | None = None
    """Copied from `ModelConfig.is_moe` by `VllmConfig`."""

    # -- vLLM fields minivllm keeps at their defaults (see VLLM_ONLY_FIELDS) ------
    nnodes: int = 1
    """Nodes the ranks of the "mp" executor are spread over (without Ray): each node
    runs ``world_size / nnodes`` consecutive ranks; node 0 runs the engine."""
    node_rank: int = 0
    """Rank of this node; above 0 the node only runs its ranks (``minivllm serve
    --node-rank K`` serves no HTTP) and takes its calls from node 0."""
    master_addr: str = "127.0.0.1"
    """Address of node 0 for a multi-node run: torch.distributed's rendezvous is at
    ``master_port``, the engine's calls to the other nodes' ranks at ``master_port + 1``."""
    master_port: int = 29501
    """Port of node 0's torch.distributed rendezvous (the next port carries the calls)."""
    data_parallel_rank_local: int | None = None
    """Local data-parallel rank (SPMD mode). Unsupported: must be None."""
    data_parallel_master_ip: str = "127.0.0.1"
    """Address of data-parallel rank 0 (``--data-parallel-address``).  minivllm's
    dense-model replicas share no collective, so it names the group only."""
    data_parallel_rpc_port: int = 29550
    """Port for data-parallel messaging (kept for vLLM configs; minivllm's replicas
    talk to their front end over pipes or Ray)."""
    data_parallel_master_port: int = 29500
    """Port of the data-parallel master (kept for vLLM configs, as above)."""
    data_parallel_hybrid_lb: bool = False
    """Hybrid data-parallel load balancing. Unsupported."""
    enable_ep_weight_filter: bool = False
    """Load only this rank's experts (expert parallelism). Unsupported."""
    enable_elastic_ep: bool = False
    """Elastic expert parallelism. Unsupported."""
    dbo_decode_token_threshold: int = 32
    """Decode-only batches above this many tokens are micro-batched (dual batch
    overlap). Unsupported to change."""
    dbo_prefill_token_threshold: int = 512
    """Batches with prefills above this many tokens are micro-batched (dual batch
    overlap). Unsupported to change."""
    ray_workers_use_nsight: bool = False
    """Profile Ray workers with Nsight. Unsupported."""
    sd_worker_cls: str = "auto"
    """Worker class for speculative decoding; only "auto" is supported."""
    worker_extension_cls: str = ""
    """Class mixed into the worker for collective RPCs. Unsupported: must be empty."""
    numa_bind: bool = False
    """Bind GPU workers to their NUMA node. Unsupported."""
    numa_bind_nodes: list[int] | None = None
    """NUMA node of each GPU worker. Unsupported: must be None."""
    numa_bind_cpus: list[str] | None = None
    """CPU list of each GPU worker. Unsupported: must be None."""
    assigned_physical_gpu_ids: list[int] | None = None
    """Logical -> physical GPU ids. Unsupported: must be None."""
    distributed_timeout_seconds: int | None = None
    """Timeout of distributed set-up. Unsupported: must be None."""
    cpu_distributed_timeout_seconds: int | None = None
    """Timeout of CPU process groups. Unsupported: must be None."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_python_only_vllm_fields(cls, data: Any) -> Any:
        """vLLM's object-valued fields get minivllm's refusal, not "unexpected keyword"."""
        kwargs = data.kwargs if isinstance(data, ArgsKwargs) else data
        if not isinstance(kwargs, dict):
            return data
        given = {k: kwargs[k] for k in VLLM_PYTHON_ONLY if kwargs.get(k) not in (None, {})}
        if given:
            problems = [
                f"{k}={v!r} ({VLLM_PYTHON_ONLY[k]}; leave it unset)" for k, v in given.items()
            ]
            raise ValueError("not supported by minivllm yet: " + "; ".join(problems) + ".")
        kept = {k: v for k, v in kwargs.items() if k not in VLLM_PYTHON_ONLY}
        if isinstance(data, ArgsKwargs):
            return ArgsKwargs(data.args, kept)
        return kept

    def __post_init__(self) -> None:
        for name in (
            "pipeline_parallel_size",
            "tensor_parallel_size",
            "prefill_context_parallel_size",
            "decode_context_parallel_size",
            "data_parallel_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        self._resolve_data_parallel()
        # Whether a worker may align cp_kv_cache_interleave_size to its block size.
        self._allow_auto_resolve_cp_interleave_size = self.cp_kv_cache_interleave_size == 1
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
        self.check_supported()
        self._check_nodes()

    def _resolve_data_parallel(self) -> None:
        """Check the data-parallel fields; an unset local size means every replica."""
        dp = self.data_parallel_size
        if self.data_parallel_backend not in ("mp", "ray"):
            raise ValueError(
                f"data_parallel_backend must be 'mp' or 'ray', got {self.data_parallel_backend!r}"
            )
        if not 0 <= self.data_parallel_rank < dp:
            raise ValueError(
                f"data_parallel_rank={self.data_parallel_rank} is not a rank of "
                f"data_parallel_size={dp}; use 0 to {dp - 1}"
            )
        if self.data_parallel_prefix_routing_slack < 0:
            raise ValueError(
                "data_parallel_prefix_routing_slack must be >= 0, got "
                f"{self.data_parallel_prefix_routing_slack}"
            )
        for name in ("data_parallel_rpc_port", "data_parallel_master_port"):
            if not 0 < getattr(self, name) < 65536:
                raise ValueError(f"{name} must be a TCP port (1-65535), got {getattr(self, name)}")
        if self.data_parallel_external_lb and self.data_parallel_index == 0:
            self.data_parallel_index = self.data_parallel_rank
        if self.data_parallel_size_local == 1 and not self.data_parallel_external_lb:
            self.data_parallel_size_local = dp
        if self.data_parallel_size_local not in (1, dp):
            raise ValueError(
                f"data_parallel_size_local={self.data_parallel_size_local} with "
                f"data_parallel_size={dp}: minivllm starts every replica from one front "
                "end; to place replicas on other nodes use --data-parallel-backend ray, or "
                "run one server per replica with --data-parallel-rank behind a load balancer"
            )

    def _check_nodes(self) -> None:
        """Multi-node runs spread the ranks of one replica evenly over the nodes."""
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank={self.node_rank} with nnodes={self.nnodes}: nnodes must be >= 1 "
                f"and node_rank one of 0 to {max(self.nnodes - 1, 0)}"
            )
        if not 0 < self.master_port < 65535:
            raise ValueError(f"master_port must be a TCP port (1-65534), got {self.master_port}")
        if self.nnodes == 1:
            return
        if self.world_size % self.nnodes:
            raise ValueError(
                f"nnodes={self.nnodes} must divide the ranks of tensor_parallel_size x "
                f"pipeline_parallel_size = {self.world_size}: each node runs as many ranks"
            )
        if self.distributed_executor_backend != "mp" or self.data_parallel_size > 1:
            raise ValueError(
                f"nnodes={self.nnodes} spreads the ranks of the 'mp' executor of one engine; "
                "with distributed_executor_backend='ray' or data_parallel_size > 1 use a Ray "
                "cluster (--distributed-executor-backend ray / --data-parallel-backend ray)"
            )

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def internal_data_parallel(self) -> bool:
        """Whether this front end starts and balances ``data_parallel_size`` replicas."""
        return self.data_parallel_size > 1 and not self.data_parallel_external_lb

    @property
    def world_size(self) -> int:
        """Ranks of one replica: pipeline x tensor x prefill-context parallel."""
        return (
            self.pipeline_parallel_size
            * self.tensor_parallel_size
            * self.prefill_context_parallel_size
        )

    @property
    def world_size_across_dp(self) -> int:
        return self.world_size * self.data_parallel_size

    @property
    def use_ubatching(self) -> bool:
        return self.enable_dbo or self.ubatch_size > 1

    @property
    def use_all2all(self) -> bool:
        """Whether MoE layers exchange tokens with all-to-all (expert parallel, DP > 1)."""
        return self.enable_expert_parallel and self.data_parallel_size > 1

    @property
    def use_sequence_parallel_moe(self) -> bool:
        return False

    def set_dcp_defaults(self) -> None:
        """Fill decode-context-parallel defaults left unset (all are static here)."""
        if self.dcp_kv_cache_interleave_size > 1 and self.cp_kv_cache_interleave_size == 1:
            self.cp_kv_cache_interleave_size = self.dcp_kv_cache_interleave_size

    def unsupported_settings(self) -> list[str]:
        """What minivllm cannot run, each with the fix."""
        problems: list[str] = []
        sizes = {
            "prefill_context_parallel_size": "prefill context parallelism",
            "decode_context_parallel_size": "decode context parallelism",
        }
        for name, what in sizes.items():
            if getattr(self, name) > 1:
                problems.append(f"{name}={getattr(self, name)} ({what}; use 1)")
        flags = {
            "enable_expert_parallel": "expert parallelism",
            "enable_eplb": "expert load balancing",
            "enable_dbo": "dual batch overlap",
            "enable_fault_tolerance": "fault tolerance",
            "enable_batch_sharded_sampling": "batch-sharded sampling",
        }
        problems += [f"{k}=True ({what})" for k, what in flags.items() if getattr(self, k)]
        if self.ubatch_size > 1:
            problems.append(f"ubatch_size={self.ubatch_size} (micro-batching; use 0)")
        if self.worker_cls != "auto":
            problems.append(f"worker_cls={self.worker_cls!r} (custom workers; use 'auto')")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, what in VLLM_ONLY_FIELDS.items():
            value, default = getattr(self, name), defaults[name]
            if value != default:
                problems.append(f"{name}={value!r} ({what}; use {default!r})")
        backend: Any = self.distributed_executor_backend
        if isinstance(backend, str) and backend not in SUPPORTED_EXECUTOR_BACKENDS:
            problems.append(
                f"distributed_executor_backend={backend!r} (use one of "
                f"{list(SUPPORTED_EXECUTOR_BACKENDS)})"
            )
        elif self.world_size > 1 and backend == "uni":
            problems.append(
                f"tensor_parallel_size={self.tensor_parallel_size} x pipeline_parallel_size="
                f"{self.pipeline_parallel_size} with distributed_executor_backend='uni' (more "
                "than one rank needs processes; use 'mp' or 'ray', or leave it unset)"
            )
        return problems

    def check_supported(self) -> None:
        """Raise ``ValueError`` listing every unsupported parallel setting."""
        problems = self.unsupported_settings()
        if problems:
            raise ValueError("not supported by minivllm yet: " + "; ".join(problems) + ".")

    def compute_hash(self) -> str:
        """Sizes and expert-parallel settings change how layers are sharded."""
        factors = [
            self.pipeline_parallel_size,
            self.tensor_parallel_size,
            self.enable_expert_parallel,
            self.data_parallel_size,
            self.all2all_backend,
            self.prefill_context_parallel_size,
            self.decode_context_parallel_size,
            self.enable_dbo,
        ]
        return hash_factors(factors)
