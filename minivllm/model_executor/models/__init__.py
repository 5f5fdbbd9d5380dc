"""Model definitions and the architecture registry."""

from minivllm.model_executor.models.registry import (
    get_model_class,
    get_model_class_for_config,
    resolve_architecture,
    supported_architectures,
)

__all__ = [
    "get_model_class",
    "get_model_class_for_config",
    "resolve_architecture",
    "supported_architectures",
]
