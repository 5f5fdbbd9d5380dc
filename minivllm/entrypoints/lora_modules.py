"""``--lora-modules``: the LoRA adapters a server serves from the start (parsed without
importing the server)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAModulePath:
    """One ``--lora-modules`` entry: the served name, its PEFT directory, its parent."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(value: str) -> LoRAModulePath:
    """``name=path`` or vLLM's JSON form ``{"name": ..., "path": ..., "base_model_name": ...}``."""
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
            return LoRAModulePath(data["name"], data["path"], data.get("base_model_name"))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise argparse.ArgumentTypeError(
                f'--lora-modules {value!r}: a JSON entry needs string keys "name" and '
                f'"path" (and optionally "base_model_name"): {exc}'
            ) from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"--lora-modules {value!r}: give name=path, or a JSON object with name and path"
        )
    return LoRAModulePath(name, path)
