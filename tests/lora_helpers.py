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


def peft_reference(
    model: torch.nn.Module, prompt: list[int], num_tokens: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities from an HF (or peft) model."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=num_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [
        float(s[0].float().log_softmax(-1)[t]) for s, t in zip(out.logits, tokens, strict=True)
    ]
    return tokens, logprobs


def check_output(output: Any, want: tuple[list[int], list[float]], tol: float = 2e-4) -> None:
    """A `RequestOutput` (sampled with ``logprobs=1``) has ``want``'s tokens and
    log-probabilities within ``tol``."""
    import pytest

    completion = output.outputs[0]
    assert completion.token_ids == want[0]
    got = [
        entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids, strict=True)
    ]
    assert got == pytest.approx(want[1], abs=tol)


def write_random_adapter(
    path: Path,
    hf_config: Any,
    *,
    r: int,
    target_modules: list[str],
    seed: int,
    scale: float = 0.05,
) -> Path:
    """A PEFT-format adapter (config + safetensors) with random A and B for every layer
    of a Llama-shaped ``hf_config``, written without building the model (the default
    model's adapters for the server tests)."""
    import json

    from safetensors.torch import save_file

    heads, hidden = hf_config.num_attention_heads, hf_config.hidden_size
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, hf_config.num_key_value_heads * head_dim
    inter = hf_config.intermediate_size
    shapes = {  # (in, out) of each HF projection
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
        "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(hf_config.num_hidden_layers):
        for name in target_modules:
            kind = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{kind}.{name}"
            n_in, n_out = shapes[name]
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, n_in, generator=gen) / n_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(n_out, r, generator=gen) * scale
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": target_modules}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
