"""PEFT LoRA checkpoints: ``adapter_config.json`` + ``adapter_model.safetensors``.

`read_peft_config` checks the config (rank, scaling, target modules, the forms minivllm
refuses and why); `check_adapter` also checks every tensor's shape against the base
model, from the safetensors header only; `load_adapter` reads the weights into
`LoRAAdapter`: per minivllm projection (``model.layers.3.self_attn.qkv_proj``) and per
slice of a merged projection (q/k/v, gate/up), ``A`` [r, in] and ``B`` [out, r] with
the scaling folded into ``B``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

PEFT_TO_MINIVLLM: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
"""PEFT's (Hugging Face's) projection names -> minivllm's layer and the slice in it."""

_PREFIX = "base_model.model."


@dataclass(frozen=True)
class PeftConfig:
    """What minivllm uses of a PEFT LoRA config."""

    rank: int
    scaling: float
    """``lora_alpha / r`` (rsLoRA: ``lora_alpha / sqrt(r)``), folded into B."""
    target_modules: tuple[str, ...]


@dataclass
class LoRAAdapter:
    """One adapter's weights, keyed by minivllm module path, then slice index."""

    rank: int
    weights: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    """module path -> slice -> (A [r, in], scaled B [out, r])."""


def _refusals(cfg: dict[str, Any]) -> list[str]:
    checks = [
        (cfg.get("peft_type", "LORA") != "LORA", f"peft_type {cfg.get('peft_type')!r} (LORA only)"),
        (bool(cfg.get("use_dora")), "DoRA (use_dora=true)"),
        (bool(cfg.get("modules_to_save")), "modules_to_save (full copies of layers)"),
        (cfg.get("bias", "none") != "none", f"bias={cfg.get('bias')!r} (only 'none')"),
        (bool(cfg.get("rank_pattern")), "rank_pattern (one rank per adapter only)"),
        (bool(cfg.get("alpha_pattern")), "alpha_pattern (one alpha per adapter only)"),
        (cfg.get("layers_to_transform") is not None, "layers_to_transform"),
        (bool(cfg.get("use_qalora")), "QA-LoRA (use_qalora=true)"),
    ]
    return [why for bad, why in checks if bad]


def read_peft_config(path: str, max_lora_rank: int) -> PeftConfig:
    """The adapter's config; ValueError naming what is wrong and how to fix it."""
    config_file = os.path.join(path, ADAPTER_CONFIG)
    if not os.path.isfile(config_file):
        raise ValueError(
            f"LoRA adapter path {path!r} has no {ADAPTER_CONFIG}; give the directory a PEFT "
            "adapter was saved to (save_pretrained)."
        )
    with open(config_file) as f:
        cfg = json.load(f)
    refused = _refusals(cfg)
    if refused:
        raise ValueError(f"LoRA adapter {path!r} uses {', '.join(refused)}: not supported.")
    rank, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", 8))
    if rank > max_lora_rank:
        raise ValueError(
            f"LoRA adapter {path!r} has rank {rank}, above max_lora_rank={max_lora_rank}; "
            "raise --max-lora-rank."
        )
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = [t for t in targets if t.split(".")[-1] not in PEFT_TO_MINIVLLM]
    if unknown:
        raise ValueError(
            f"LoRA adapter {path!r} targets {unknown}; minivllm serves adapters on "
            f"{sorted(PEFT_TO_MINIVLLM)}."
        )
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    return PeftConfig(rank, scaling, tuple(targets))


def _module_of(key: str) -> tuple[str, int, str]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` ->
    (``model.layers.0.self_attn.qkv_proj``, 0, "lora_A")."""
    name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
    parts = name.split(".")
    if len(parts) < 4 or parts[-1] != "weight" or parts[-2] not in ("lora_A", "lora_B"):
        raise ValueError(f"tensor {key!r} is not a LoRA A/B weight minivllm can serve")
    proj = parts[-3]
    if proj not in PEFT_TO_MINIVLLM:
        raise ValueError(f"tensor {key!r} adapts {proj!r}, not one of {sorted(PEFT_TO_MINIVLLM)}")
    layer, index = PEFT_TO_MINIVLLM[proj]
    return ".".join([*parts[:-3], layer]), index, parts[-2]


def _weights_file(path: str) -> str:
    weights = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(weights):
        raise ValueError(
            f"LoRA adapter path {path!r} has no {ADAPTER_WEIGHTS} (minivllm reads "
            "safetensors adapters; save with safe_serialization=True)."
        )
    return weights


def check_adapter(
    path: str, max_lora_rank: int, slice_shapes: dict[str, list[tuple[int, int]]]
) -> PeftConfig:
    """The config, after checking every tensor against ``slice_shapes`` (layer name ->
    per slice (in_features, out_features)) from the safetensors header."""
    from safetensors import safe_open

    peft = read_peft_config(path, max_lora_rank)
    with safe_open(_weights_file(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            module, index, kind = _module_of(key)
            shape = tuple(f.get_slice(key).get_shape())
            in_size, out_size = slice_shapes[module.split(".")[-1]][index]
            want = (peft.rank, in_size) if kind == "lora_A" else (out_size, peft.rank)
            if shape != want:
                raise ValueError(
                    f"LoRA adapter {path!r}: {key} has shape {list(shape)}, the base model "
                    f"needs {list(want)}; the adapter was trained for another base model."
                )
    return peft


def load_adapter(path: str, max_lora_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """The adapter's weights (checked with `check_adapter` beforehand)."""
    from safetensors.torch import load_file

    peft = read_peft_config(path, max_lora_rank)
    pairs: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(_weights_file(path)).items():
        module, index, kind = _module_of(key)
        pairs.setdefault((module, index), {})[kind] = tensor
    adapter = LoRAAdapter(peft.rank)
    for (module, index), ab in pairs.items():
        a, b = ab["lora_A"].to(dtype), (ab["lora_B"].float() * peft.scaling).to(dtype)
        adapter.weights.setdefault(module, {})[index] = (a, b)
    return adapter


def slice_shapes_of(hf_config: Any) -> dict[str, list[tuple[int, int]]]:
    """Per minivllm projection, (in, out) of each slice, from a Llama-style HF config."""
    hidden = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    inter = hf_config.intermediate_size
    return {
        "qkv_proj": [(hidden, heads * head_dim), *[(hidden, kv_heads * head_dim)] * 2],
        "o_proj": [(heads * head_dim, hidden)],
        "gate_up_proj": [(hidden, inter), (hidden, inter)],
        "down_proj": [(inter, hidden)],
    }
