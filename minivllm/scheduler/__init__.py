"""Request scheduling: continuous batching, chunked prefill, preemption (torch-free)."""

from minivllm.scheduler.options import SchedulerOptions
from minivllm.scheduler.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from minivllm.scheduler.request import Request, RequestStatus
from minivllm.scheduler.scheduler import Scheduler

__all__ = [
    "CachedRequestData",
    "EngineCoreOutput",
    "ModelRunnerOutput",
    "NewRequestData",
    "Request",
    "RequestStatus",
    "Scheduler",
    "SchedulerOptions",
    "SchedulerOutput",
]
