"""``GET /v1/models``, the served-model-name check and the LoRA adapters served by name."""

from __future__ import annotations

import itertools

from minivllm.entrypoints.openai.protocol import ModelCard, ModelList
from minivllm.lora.request import LoRARequest


class OpenAIServingModels:
    """The names this server answers to; the first is the one responses carry.  A LoRA
    adapter is served under its own name (a request's ``model`` selects it)."""

    def __init__(self, served_names: list[str], max_model_len: int) -> None:
        if not served_names:
            raise ValueError("at least one served model name is needed")
        self.served_names = list(dict.fromkeys(served_names))
        self.max_model_len = max_model_len
        self.loras: dict[str, LoRARequest] = {}
        """Adapters by served name, in the order they were added."""
        self._lora_ids = itertools.count(1)

    @property
    def all_names(self) -> list[str]:
        """The base model's names, then the adapters'."""
        return [*self.served_names, *self.loras]

    def is_served(self, name: str) -> bool:
        return name in self.served_names or name in self.loras

    def model_name(self, requested: str | None = None) -> str:
        """The name to put in a response (the one the client used, when it is ours)."""
        if requested is not None and self.is_served(requested):
            return requested
        return self.served_names[0]

    def lora_for(self, name: str | None) -> LoRARequest | None:
        """The adapter served as ``name`` (None: the base model)."""
        return None if name is None else self.loras.get(name)

    def new_lora_request(
        self, name: str, path: str, base_model_name: str | None = None
    ) -> LoRARequest:
        """A `LoRARequest` with the next free id (not served until `add_lora`)."""
        if name in self.served_names:
            raise ValueError(f"LoRA adapter name {name!r} is the base model's name; rename it.")
        parent = base_model_name or self.served_names[0]
        return LoRARequest(name, next(self._lora_ids), path, base_model_name=parent)

    def add_lora(self, request: LoRARequest) -> None:
        self.loras[request.lora_name] = request

    def remove_lora(self, name: str) -> None:
        del self.loras[name]

    def show_available_models(self) -> ModelList:
        base = self.served_names[0]
        # root names the model, never the file it was read from (a path on this
        # machine is nobody else's business).
        cards = [
            ModelCard(id=name, root=base, max_model_len=self.max_model_len)
            for name in self.served_names
        ]
        cards += [
            ModelCard(
                id=name,
                root=name,
                parent=lora.base_model_name or base,
                max_model_len=self.max_model_len,
            )
            for name, lora in self.loras.items()
        ]
        return ModelList(data=cards)
