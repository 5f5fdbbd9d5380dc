"""PEFT LoRA adapters with random, non-zero weights, saved for tests (seconds on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def save_peft_adapter(
    base: torch.nn.Module,
    path: Path,
    *,
    r: int,
    target_modules: list[str],
    seed: int,
    lora_alpha: int = 16,
    **extra: Any,
) -> torch.nn.Module:
    """Save a LoRA adapter of ``base`` (an HF model) to ``path``; returns the PEFT model
    (eval mode), the reference for the adapter's logits.  ``init_lora_weights=False``
    makes B random too (PEFT's default starts B at zero: an adapter that does nothing)."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=target_modules,
        init_lora_weights=False,
        lora_dropout=0.0,
        **extra,
    )
    model = get_peft_model(copy.deepcopy(base), config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:  # big enough to change greedy tokens of the tiny model
                param.mul_(3.0)
    model.save_pretrained(str(path))
    return model
