"""Process groups and collectives for tensor and pipeline parallelism.

`parallel_state` sets up torch.distributed (gloo on CPU, nccl on CUDA) and the
tensor-/pipeline-parallel groups; `communicator` is what the model layers call.
"""

from minivllm.distributed.communicator import GroupCoordinator
from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_pp_group,
    get_tp_group,
    get_world_group,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
    output_rank,
)

__all__ = [
    "GroupCoordinator",
    "destroy_distributed_environment",
    "get_pp_group",
    "get_tp_group",
    "get_world_group",
    "init_distributed_environment",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
    "output_rank",
]
