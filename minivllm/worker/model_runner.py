"""The model runner: turns a `SchedulerOutput` into one forward pass and samples.

It keeps each request's state between steps (token ids, block table, sampling
generator), flattens the scheduled tokens of all requests into one batch over
the paged KV cache, runs the model inside a forward context, samples the
requests whose context is complete, and returns a `ModelRunnerOutput`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minivllm.attention.layer import bind_kv_caches, get_attention_layers
from minivllm.attention.paged_kv import (
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    resolve_kv_cache_dtype,
)
from minivllm.config.vllm import set_current_vllm_config
from minivllm.logger import init_logger
from minivllm.model_executor.custom_op import op_registry
from minivllm.model_executor.layers.cpu_gemm import pack_linear_weights
from minivllm.model_executor.loader import load_model
from minivllm.sample.logprobs import compute_prompt_logprobs
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput
from minivllm.worker.forward_runner import ForwardRunner
from minivllm.worker.input_batch import CachedRequestState, StepInputs, build_step_inputs

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class ModelRunner:
    """Owns the model, its KV cache tensors and the per-request state."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.device = device
        self.dtype: torch.dtype = self.model_config.dtype
        self.block_size: int = self.cache_config.block_size
        self.kv_cache_dtype = resolve_kv_cache_dtype(self.cache_config.cache_dtype, self.dtype)
        self.states: dict[str, CachedRequestState] = {}
        self.sampler = Sampler()
        self.model: torch.nn.Module | None = None
        self.forward_runner: ForwardRunner | None = None
        self.attn_layers: dict[str, Any] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.vocab_size: int = self.model_config.get_vocab_size()

    # -- set-up -------------------------------------------------------------
    def load_model(self) -> None:
        mc = self.model_config
        load_format = self.vllm_config.load_config.load_format
        logger.info("start-up 1/4: loading the weights of %s", mc.model)
        with set_current_vllm_config(self.vllm_config):
            self.model = load_model(
                mc.model,
                mc.hf_config,
                self.dtype,
                load_format=load_format,
                device=self.device,
                keep_quantized=mc.quantization == "gguf",
            )
        # Warn about custom_ops entries that named no op of this model.
        self.vllm_config.compilation_config.custom_op_log_check(op_registry)
        self.model.eval()
        packed = pack_linear_weights(self.model, self.device, self.dtype)
        if packed:
            logger.info("packed %d linear weights for oneDNN GEMMs", packed)
        self.attn_layers = get_attention_layers(self.model)
        # Compilation (CompilationConfig.mode) and CUDA graphs: see worker/forward_runner.py.
        self.forward_runner = ForwardRunner(
            self.model, self.vllm_config, self.attn_layers, self.device
        )
        self.forward_runner.compile_and_warm_up()

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block takes over all layers."""
        mc = self.model_config
        return kv_cache_bytes_per_block(
            self.block_size,
            mc.get_total_num_kv_heads(),
            mc.get_head_size(),
            self.kv_cache_dtype,
            num_layers=len(self.attn_layers) or mc.get_total_num_hidden_layers(),
        )

    def initialize_kv_cache(self, num_blocks: int) -> None:
        mc = self.model_config
        self.kv_caches = allocate_kv_caches(
            len(self.attn_layers),
            num_blocks,
            self.block_size,
            mc.get_total_num_kv_heads(),
            mc.get_head_size(),
            self.kv_cache_dtype,
            self.device,
        )
        bind_kv_caches(self.attn_layers, self.kv_caches)
        assert self.forward_runner is not None, "load_model() first"
        self.forward_runner.capture_cudagraphs()

    # -- per step -----------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> dict[str, str]:
        """Apply the scheduler's deltas; returns the new requests whose own set-up failed
        (id -> error), which are left out of this step instead of failing the batch."""
        failed: dict[str, str] = {}
        for req_id in so.finished_req_ids:
            self.states.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            try:
                state = CachedRequestState.from_new(new, self.device)
                self._replay_generator(state)
            except Exception as exc:  # e.g. a seed torch.Generator refuses
                logger.exception("request %s cannot run; failing it alone", new.req_id)
                failed[new.req_id] = f"{type(exc).__name__}: {exc}"
                continue
            self.states[new.req_id] = state
        cached = so.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            state = self.states[req_id]
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = num_computed
        return failed

    def _replay_generator(self, state: CachedRequestState) -> None:
        """A request rebuilt after preemption continues its seeded random stream."""
        if state.generator is None or not state.output_token_ids:
            return
        scratch = torch.empty(self.vocab_size, device=self.device)
        for _ in state.output_token_ids:
            scratch.exponential_(generator=state.generator)

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; requests are processed in the scheduler's order."""
        assert self.model is not None and self.forward_runner is not None, "load_model() first"
        failed = self._update_states(so)
        req_ids = [r for r in so.num_scheduled_tokens if r not in failed]
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[], failed_req_ids=failed)
        inputs = build_step_inputs(
            self.states, req_ids, so.num_scheduled_tokens, self.block_size, self.device
        )
        hidden = self.forward_runner.run(inputs.input_ids, inputs.positions, inputs.attn_metadata)
        prompt_logprobs = self._prompt_logprobs(hidden, inputs)

        sampled: dict[str, int] = {}
        entries: dict[str, Any] = {}
        if inputs.sample_req_ids:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            states = [self.states[r] for r in inputs.sample_req_ids]
            meta = SamplingMetadata.build(states, self.vocab_size, self.device)
            out = self.sampler(logits, meta)
            tokens = out.sampled_token_ids.tolist()
            row_entries = (
                out.logprobs.to_entries(meta.num_logprobs)
                if out.logprobs is not None
                else [None] * len(tokens)
            )
            for state, token, entry in zip(states, tokens, row_entries, strict=True):
                state.output_token_ids.append(token)
                sampled[state.req_id] = token
                entries[state.req_id] = entry

        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in req_ids],
            logprobs=[[entries[r]] if entries.get(r) is not None else None for r in req_ids],
            prompt_logprobs=prompt_logprobs,
            failed_req_ids=failed,
        )

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: StepInputs) -> dict[str, list[Any]]:
        """Logprobs of the prompt tokens computed this step, for requests that asked."""
        result: dict[str, list[Any]] = {}
        offset = 0
        for req_id, n in zip(inputs.req_ids, inputs.num_scheduled, strict=True):
            state = self.states[req_id]
            num_logprobs = state.sampling_params.prompt_logprobs
            start = state.num_computed_tokens
            num_prompt = len(state.prompt_token_ids)
            # Position p predicts prompt token p + 1; the last prompt position
            # predicts the first output token, which is not a prompt logprob.
            end = min(start + n, num_prompt - 1)
            if num_logprobs is not None and start < num_prompt:
                chunk: list[Any] = [None] if start == 0 else []
                if end > start:
                    rows = hidden[offset : offset + (end - start)]
                    logits = self.model.compute_logits(rows)  # type: ignore[union-attr]
                    targets = torch.tensor(
                        state.prompt_token_ids[start + 1 : end + 1], device=self.device
                    )
                    tensors = compute_prompt_logprobs(logits, targets, num_logprobs)
                    k = self.vocab_size if num_logprobs == -1 else num_logprobs
                    chunk += tensors.to_entries([k] * (end - start))
                result[req_id] = chunk
            offset += n
        return result
