"""``GET /v1/models`` and the served-model-name check."""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import ModelCard, ModelList


class OpenAIServingModels:
    """The names this server answers to; the first is the one responses carry."""

    def __init__(self, served_names: list[str], max_model_len: int) -> None:
        if not served_names:
            raise ValueError("at least one served model name is needed")
        self.served_names = list(dict.fromkeys(served_names))
        self.max_model_len = max_model_len

    def is_served(self, name: str) -> bool:
        return name in self.served_names

    def model_name(self, requested: str | None = None) -> str:
        """The name to put in a response (the one the client used, when it is ours)."""
        if requested is not None and requested in self.served_names:
            return requested
        return self.served_names[0]

    def show_available_models(self) -> ModelList:
        return ModelList(
            data=[
                # root names the model, never the file it was read from (a path on
                # this machine is nobody else's business).
                ModelCard(id=name, root=self.served_names[0], max_model_len=self.max_model_len)
                for name in self.served_names
            ]
        )
