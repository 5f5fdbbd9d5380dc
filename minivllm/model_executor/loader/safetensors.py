"""Weights of an HF checkpoint directory (safetensors, else PyTorch ``*.bin``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from minivllm.model_executor.layers.tensor_parallel import LazyWeight


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        # The index names the files of the HF layout; a repo may also ship
        # other-format copies (e.g. consolidated.safetensors) that must be skipped.
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted({model_dir / f for f in weight_map.values()})
    files = sorted(model_dir.glob("*.safetensors"))
    preferred = [f for f in files if not f.name.startswith("consolidated")]
    return preferred or files


def _bin_files(model_dir: Path) -> list[Path]:
    skip = {"training_args.bin", "optimizer.bin", "scheduler.bin"}
    return sorted(
        f
        for f in list(model_dir.glob("*.bin")) + list(model_dir.glob("*.pt"))
        if f.name not in skip
    )


def has_hf_weights(model_dir: str | os.PathLike[str]) -> bool:
    """Whether the directory holds safetensors or ``*.bin`` weights."""
    d = Path(model_dir)
    return bool(_safetensors_files(d) or _bin_files(d))


def hf_weights_iterator(
    model_dir: str | os.PathLike[str], lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor | LazyWeight]]:
    """``(name, tensor)`` pairs of every weight in the directory, file by file.

    ``lazy``: safetensors weights come as `LazyWeight` (read when a loader asks, and
    only the slice it asks for: a tensor-parallel rank reads its shard alone).
    """
    d = Path(model_dir)
    st_files = _safetensors_files(d)
    if st_files:
        for f in st_files:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    yield name, LazyWeight(sf.get_slice(name)) if lazy else sf.get_tensor(name)
        return
    bin_files = _bin_files(d)
    if not bin_files:
        raise ValueError(
            f"no *.safetensors or *.bin weights in {d}; point the model at an HF checkpoint "
            "directory or a .gguf file"
        )
    for f in bin_files:
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        yield from state.items()
