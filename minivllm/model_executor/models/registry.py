"""Which model class implements which HF architecture name.

Classes are imported on first use so importing the registry stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "BertModel": ("bert", "BertModel"),
    "BertForSequenceClassification": ("bert", "BertForSequenceClassification"),
}

# Pooling architectures run as their family's decoder plus a pooler (`adapters`).
_POOLING_BASES: dict[str, str] = {
    f"{family}{kind}": f"{family}ForCausalLM"
    for family in ("Llama", "Qwen2", "Qwen3")
    for kind in ("Model", "ForSequenceClassification")
}

# GGUF-derived configs often carry only a model_type, no architectures list.
_MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


def supported_architectures() -> list[str]:
    """Architecture names `get_model_class` accepts."""
    return sorted(_MODELS)


def get_pooling_model_class(hf_config: Any, task: str) -> type[nn.Module]:
    """The pooling model for a config and a task ("embed" / "classify"): a native
    encoder (BERT) or a decoder family wrapped by `adapters.as_pooling_model`."""
    from minivllm.model_executor.models.adapters import as_pooling_model

    arch = resolve_architecture(hf_config)
    if arch == "BertModel" and task != "embed":
        raise ValueError("BertModel has no classification head; use convert='embed'")
    if arch.startswith("Bert"):
        # A BERT classifier run as an embedder keeps only its encoder.
        return get_model_class(
            "BertForSequenceClassification" if task == "classify" else "BertModel"
        )
    return as_pooling_model(get_model_class(_POOLING_BASES.get(arch, arch)), task)


def get_model_class(architecture: str) -> type[nn.Module]:
    """The model class for an HF architecture name such as ``"LlamaForCausalLM"``."""
    if architecture not in _MODELS:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: "
            f"{', '.join(supported_architectures())}"
        )
    module_name, class_name = _MODELS[architecture]
    module = importlib.import_module(f"minivllm.model_executor.models.{module_name}")
    return getattr(module, class_name)


def resolve_architecture(hf_config: Any) -> str:
    """The first supported entry of ``hf_config.architectures`` (or from ``model_type``)."""
    # getattr: transformers configs built from a bare model_type have no architectures.
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _MODELS or arch in _POOLING_BASES:
            return arch
    model_type = getattr(hf_config, "model_type", None)
    if not archs and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(
        f"model architectures {archs or [model_type]} are not supported; supported: "
        f"{', '.join(supported_architectures())}"
    )


def get_model_class_for_config(hf_config: Any) -> type[nn.Module]:
    """Model class for a transformers config (see `resolve_architecture`)."""
    return get_model_class(resolve_architecture(hf_config))
