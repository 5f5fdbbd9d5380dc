"""LoRA adapters on the server: ``--lora-modules``, the adapters a request's ``model``
selects, and ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, as in vLLM)."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from minivllm import envs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.entrypoints.lora_modules import LoRAModulePath
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels


class LoadLoRAAdapterRequest(BaseModel):
    """Body of ``/v1/load_lora_adapter``."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """Body of ``/v1/unload_lora_adapter``."""

    lora_name: str
    lora_int_id: int | None = None


def add_static_loras(
    models: OpenAIServingModels, engine: AsyncLLM, modules: list[LoRAModulePath]
) -> None:
    """Serve the ``--lora-modules`` adapters (each checked now: a bad one stops start-up
    with the reason)."""
    for module in modules:
        request = models.new_lora_request(module.name, module.path, module.base_model_name)
        engine.add_lora(request)
        models.add_lora(request)


def add_lora_routes(app: FastAPI, models: OpenAIServingModels, engine: AsyncLLM) -> None:
    """The runtime adapter routes, when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` allows them."""
    if not envs.allow_runtime_lora_updating():
        return

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        if models.lora_for(body.lora_name) is not None:
            raise OpenAIServingError(
                f"The lora adapter '{body.lora_name}' has already been loaded.",
                param="lora_name",
            )
        request = models.new_lora_request(body.lora_name, body.lora_path)
        try:
            engine.add_lora(request)
        except ValueError as exc:
            raise OpenAIServingError(str(exc), param="lora_path") from None
        models.add_lora(request)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        request = models.lora_for(body.lora_name)
        if request is None:
            raise OpenAIServingError(
                f"The lora adapter '{body.lora_name}' cannot be found.",
                HTTPStatus.NOT_FOUND,
                param="lora_name",
            )
        models.remove_lora(body.lora_name)
        engine.remove_lora(request.lora_int_id)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
