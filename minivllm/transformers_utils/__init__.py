"""Reading model configurations from local HF directories and GGUF files (never a hub)."""

from minivllm.transformers_utils.config import (
    default_model_path,
    get_hf_config,
    is_gguf,
    read_gguf_header,
    read_gguf_metadata,
)

__all__ = [
    "default_model_path",
    "get_hf_config",
    "is_gguf",
    "read_gguf_header",
    "read_gguf_metadata",
]
