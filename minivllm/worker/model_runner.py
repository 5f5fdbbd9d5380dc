"""The model runner: turns a `SchedulerOutput` into one forward pass and samples.

It keeps each request's state between steps (token ids, block table, sampling
generator), flattens the scheduled tokens of all requests into one batch over
the paged KV cache, runs the model inside a forward context, samples the
requests whose context is complete, and returns a `ModelRunnerOutput`.

With more than one rank only the output rank (the first tensor-parallel rank of
the last pipeline stage) samples; the other ranks append the tokens the
scheduler sends with each request (`CachedRequestData.new_token_ids`) before
they build the step's inputs, so no collective per step shares the tokens and
the pipeline stages never wait for each other beyond the activations they pass on.
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
from minivllm.distributed import get_pp_group, get_world_group, output_rank
from minivllm.kernels import inductor_isa
from minivllm.kv_cache.groups import KVCacheGroups, plan_kv_cache_groups
from minivllm.kv_transfer.worker_side import make_worker_connector, run_with_connector
from minivllm.logger import init_logger
from minivllm.lora.manager import LoRAManager, make_lora_manager
from minivllm.model_executor.custom_op import op_registry
from minivllm.model_executor.layers.cpu_gemm import pack_linear_weights
from minivllm.model_executor.loader import load_model
from minivllm.sample.logprobs import prompt_logprob_entries
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.rejection_sampler import verify
from minivllm.sample.sampler import (
    INVALID_TOKEN_ID,
    NO_ALLOWED_TOKEN_ID,
    Sampler,
    draw_uniform,
)
from minivllm.sampling_params import NO_ALLOWED_TOKEN_ERROR
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput
from minivllm.structured_output.bitmask import GrammarBitmask
from minivllm.structured_output.reasoning_gate import reasoning_markers
from minivllm.worker.forward_runner import ForwardRunner
from minivllm.worker.input_batch import CachedRequestState, StepInputs, build_step_inputs
from minivllm.worker.pooling_runner import PoolingRunner
from minivllm.worker.spec_decode import SpecDecoder
from minivllm.worker.weight_pages import log_placement, place_on_huge_pages

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
        self.lora: LoRAManager | None = None
        """The LoRA layers' adapter slots (None: LoRA off)."""
        self.forward_runner: ForwardRunner | None = None
        self.attn_layers: dict[str, Any] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.kv_groups: KVCacheGroups | None = None
        """How the attention layers share KV blocks (set by `load_model`)."""
        self.vocab_size: int = self.model_config.get_vocab_size()
        # Speculative decoding: proposes drafts; its sampling path verifies them.
        self.spec: SpecDecoder | None = None
        if vllm_config.speculative_config is not None:
            self.spec = SpecDecoder(vllm_config, device)
        self.grammar_bitmask = GrammarBitmask(
            self.vocab_size, device, vllm_config.structured_outputs_config
        )
        self.reasoning_markers = reasoning_markers(vllm_config)
        """Token ids of a reasoning model's markers (None: no reasoning parser)."""
        world = get_world_group()
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.is_output_rank = world.rank_in_group == output_rank(world.world_size, tp_size)
        """Whether this rank samples (and its output is the step's result)."""
        self.pooling: PoolingRunner | None = None
        """Pooling models (``runner="pooling"``): pools instead of sampling."""
        self.kv_connector = make_worker_connector(vllm_config)
        """The KV connector's worker half (None: no connector)."""

    # -- set-up -------------------------------------------------------------
    def load_model(self) -> None:
        model_config = self.model_config
        load_format = self.vllm_config.load_config.load_format
        logger.info("start-up 1/4: loading the weights of %s", model_config.model)
        compilation = self.vllm_config.compilation_config
        if self.device.type == "cpu" and compilation.mode and compilation.backend == "inductor":
            # Inductor's ISA check (a first start's: ~8 s of compilers) runs while the
            # weights load and minivllm's kernels build; the compile waits for it.
            inductor_isa.start_checking()
        spec = self.vllm_config.speculative_config
        if spec is not None:
            logger.info("speculative decoding: %s", spec.summary())
        with set_current_vllm_config(self.vllm_config):
            self.model = load_model(
                model_config.model,
                model_config.hf_config,
                self.dtype,
                load_format=load_format,
                device=self.device,
                quantization=model_config.quantization,
                pooling_task=model_config.convert_type
                if model_config.runner_type == "pooling"
                else None,
            )
        if model_config.pooler_config is not None:
            self.pooling = PoolingRunner(self.model, model_config.pooler_config.pooling_type)
        # Warn about custom_ops entries that named no op of this model.
        self.vllm_config.compilation_config.custom_op_log_check(op_registry)
        self.model.eval()
        if self.device.type == "cpu":  # before anything keeps references to the weights
            log_placement(place_on_huge_pages(self.model))
        packed = pack_linear_weights(self.model, self.device, self.dtype)
        if packed:
            logger.info("packed %d linear weights for oneDNN GEMMs", packed)
        self.lora = make_lora_manager(self.model, self.vllm_config, self.device)
        self.attn_layers = get_attention_layers(self.model)
        # Without the hybrid KV cache manager every layer keeps a whole-context table
        # (attention still honours each layer's window).
        one_layout = self.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        self.kv_groups = plan_kv_cache_groups(
            [None if one_layout else layer.sliding_window for layer in self.attn_layers.values()]
        )
        if self.kv_groups.is_hybrid:
            logger.info(
                "KV cache groups: %d (sliding windows %s), %d layers' worth per block",
                self.kv_groups.num_groups,
                self.kv_groups.windows,
                self.kv_groups.num_slots,
            )
        # Compilation (CompilationConfig.mode) and CUDA graphs: see worker/forward_runner.py.
        self.forward_runner = ForwardRunner(
            self.model, self.vllm_config, self.attn_layers, self.device
        )
        self.forward_runner.compile_and_warm_up()
        if self.spec is not None:
            self.spec.load_model(self.vocab_size)

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block takes over all layers."""
        model_config = self.model_config
        target = kv_cache_bytes_per_block(
            self.block_size,
            model_config.get_num_kv_heads(self.vllm_config.parallel_config),
            model_config.get_head_size(),
            self.kv_cache_dtype,
            num_layers=self.kv_groups.num_slots
            if self.kv_groups is not None
            else model_config.get_total_num_hidden_layers(),
        )
        # A draft model keeps its KV in the same blocks (same block tables).
        draft = self.spec.kv_cache_bytes_per_block(self.block_size) if self.spec else 0
        return target + draft

    def initialize_kv_cache(self, num_blocks: int) -> None:
        model_config = self.model_config
        groups = self.kv_groups
        assert groups is not None, "load_model() first"
        self.kv_caches = allocate_kv_caches(
            groups.num_slots,
            num_blocks,
            self.block_size,
            model_config.get_num_kv_heads(self.vllm_config.parallel_config),
            model_config.get_head_size(),
            self.kv_cache_dtype,
            self.device,
        )
        # Layers of different groups share a tensor: a block id is used by one group.
        per_layer = [self.kv_caches[slot] for slot in groups.layer_slot]
        bind_kv_caches(self.attn_layers, per_layer, groups.layer_group)
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(
                dict(zip(self.attn_layers, per_layer, strict=True))
            )
        if self.spec is not None:
            self.spec.initialize_kv_cache(num_blocks, self.block_size)
        assert self.forward_runner is not None, "load_model() first"
        self.forward_runner.capture_cudagraphs()

    @property
    def num_kv_groups(self) -> int:
        return 1 if self.kv_groups is None else self.kv_groups.num_groups

    # -- per step -----------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> dict[str, str]:
        """Apply the scheduler's deltas; returns the new requests whose own set-up failed
        (id -> error), which are left out of this step instead of failing the batch."""
        failed: dict[str, str] = {}
        for req_id in scheduler_output.finished_req_ids:
            self.states.pop(req_id, None)
            if self.pooling is not None:
                self.pooling.forget(req_id)
            if self.spec is not None:
                self.spec.forget(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            try:
                state = CachedRequestState.from_new(new, self.device, self.reasoning_markers)
                self._replay_generator(state)
            except Exception as exc:  # e.g. a seed torch.Generator refuses
                logger.exception("request %s cannot run; failing it alone", new.req_id)
                failed[new.req_id] = f"{type(exc).__name__}: {exc}"
                continue
            self.states[new.req_id] = state
        cached = scheduler_output.scheduled_cached_reqs
        for i, (req_id, new_blocks, num_computed) in enumerate(
            zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True)
        ):
            state = self.states[req_id]
            kept = cached.num_kept_blocks[i] if i < len(cached.num_kept_blocks) else None
            if kept is not None:
                # The scheduler freed the blocks that held only rejected drafts.
                state.truncate_block_ids(kept, self.num_kv_groups)
            state.append_block_ids(new_blocks, self.num_kv_groups)
            state.num_computed_tokens = num_computed
            if not self.is_output_rank and cached.new_token_ids:
                state.output_token_ids.extend(cached.new_token_ids[i])
        return failed

    def _replay_generator(self, state: CachedRequestState) -> None:
        """A request rebuilt after preemption continues its seeded random stream."""
        if state.generator is None or not state.output_token_ids or self.spec is not None:
            return  # speculative decoding keys a seeded request's draws by position
        for _ in state.output_token_ids:
            draw_uniform(state.generator, self.device)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; requests are processed in the scheduler's order."""
        connector = self.kv_connector
        if connector is None:
            return self._execute_model(scheduler_output)
        return run_with_connector(connector, scheduler_output, self._execute_model)

    def _execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        assert self.model is not None and self.forward_runner is not None, "load_model() first"
        if self.lora is not None and scheduler_output.removed_lora_ids:
            self.lora.remove_adapters(scheduler_output.removed_lora_ids)
        failed = self._update_states(scheduler_output)
        req_ids = [r for r in scheduler_output.num_scheduled_tokens if r not in failed]
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[], failed_req_ids=failed)
        inputs = build_step_inputs(
            self.states,
            req_ids,
            scheduler_output.num_scheduled_tokens,
            self.block_size,
            self.device,
            scheduler_output.scheduled_spec_decode_tokens,
            self.num_kv_groups,
        )
        if self.lora is not None:
            self.lora.set_batch(
                [self.states[r].lora_request for r in req_ids],
                [scheduler_output.num_scheduled_tokens[r] for r in req_ids],
            )
        hidden = self.forward_runner.run(inputs.input_ids, inputs.positions, inputs.attn_metadata)
        if self.pooling is not None:
            return ModelRunnerOutput(
                req_ids=req_ids,
                sampled_token_ids=[[] for _ in req_ids],
                pooler_output=self.pooling.pool_step(hidden, inputs, self.states),
                failed_req_ids=failed,
            )
        # Only the last pipeline stage holds the final hidden states.
        last_stage = get_pp_group().is_last_rank
        prompt_logprobs = self._prompt_logprobs(hidden, inputs) if last_stage else {}

        if self.spec is not None:
            return self._execute_spec(
                scheduler_output, inputs, hidden, req_ids, prompt_logprobs, failed
            )
        sampled: dict[str, int] = {}
        entries: dict[str, Any] = {}
        if inputs.sample_req_ids and not self.is_output_rank:
            if last_stage:  # the logits' all-gather needs every tensor-parallel rank
                self.model.compute_logits(hidden[inputs.logits_indices])
            # The scheduler sends the output rank's tokens with the request's next step.
            return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[], failed_req_ids=failed)
        if inputs.sample_req_ids:
            states = [self.states[r] for r in inputs.sample_req_ids]
            row_entries: list[Any] = [None] * len(states)
            matchers = [s.step_matcher() for s in states]
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            meta = SamplingMetadata.build(states, self.vocab_size, self.device)
            # A request whose grammar breaks a limit ends alone (in `failed`).
            meta.grammar_bitmask = self.grammar_bitmask.fill(
                matchers, inputs.sample_req_ids, failed
            )
            out = self.sampler(logits, meta)
            tokens = out.sampled_token_ids.tolist()
            if out.logprobs is not None:
                row_entries = out.logprobs.to_entries(meta.num_logprobs)
            if min(tokens) < 0:  # INVALID_TOKEN_ID or NO_ALLOWED_TOKEN_ID
                states, matchers, tokens, row_entries = _drop_invalid_rows(
                    states, matchers, tokens, row_entries, failed
                )
                req_ids = [r for r in req_ids if r not in failed]
            self.grammar_bitmask.accept([s.req_id for s in states], matchers, tokens, failed)
            for state, token, entry in zip(states, tokens, row_entries, strict=True):
                state.observe_reasoning(token)
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

    def _execute_spec(
        self,
        scheduler_output: SchedulerOutput,
        inputs: StepInputs,
        hidden: torch.Tensor,
        req_ids: list[str],
        prompt_logprobs: dict[str, list[Any]],
        failed: dict[str, str],
    ) -> ModelRunnerOutput:
        """Sampling with speculative decoding: verify drafts, then propose new ones."""
        assert self.spec is not None and self.model is not None
        sampled: dict[str, list[int]] = {}
        entries: dict[str, Any] = {}
        drafts: dict[str, list[int]] = {}
        if inputs.sample_req_ids:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            states = [self.states[r] for r in inputs.sample_req_ids]
            noise = self.spec.take_draft_noise(inputs.sample_req_ids, inputs.sample_drafts)
            out = verify(logits, states, inputs.sample_drafts, self.vocab_size, noise)
            for state, tokens, entry in zip(states, out.token_ids, out.logprobs, strict=True):
                error = invalid_token_error(tokens[-1])
                if error is not None:  # a bad row ends the request alone, as in sampling
                    failed[state.req_id] = error
                    continue
                state.output_token_ids.extend(tokens)
                sampled[state.req_id] = tokens
                entries[state.req_id] = entry
            states = [s for s in states if s.req_id not in failed]
            if scheduler_output.num_spec_tokens_to_propose and states:
                drafts = self.spec.propose(states, scheduler_output.num_spec_tokens_to_propose)
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[sampled.get(r, []) for r in req_ids],
            logprobs=[entries.get(r) for r in req_ids],
            prompt_logprobs=prompt_logprobs,
            spec_token_ids=[drafts.get(r, []) for r in req_ids],
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
                    targets = torch.tensor(
                        state.prompt_token_ids[start + 1 : end + 1], device=self.device
                    )
                    chunk += prompt_logprob_entries(
                        rows,
                        self.model.compute_logits,  # type: ignore[union-attr]
                        targets,
                        num_logprobs,
                    )
                result[req_id] = chunk
            offset += n
        return result


def invalid_token_error(token: int) -> str | None:
    """Why the sampler's marker ``token`` means no token could be picked (None for a
    real token id)."""
    if token == NO_ALLOWED_TOKEN_ID:
        return (
            f"{NO_ALLOWED_TOKEN_ERROR} by the request's constraints (allowed_token_ids, "
            "structured output, logit_bias, min_tokens), so no token could be sampled"
        )
    if token == INVALID_TOKEN_ID:
        return (
            "the logits became NaN or infinite, so no token could be sampled; check "
            "the sampling parameters"
        )
    return None


def _drop_invalid_rows(
    states: list[Any],
    matchers: list[Any],
    tokens: list[int],
    entries: list[Any],
    failed: dict[str, str],
) -> tuple[list[Any], list[Any], list[int], list[Any]]:
    """The rows whose logits were finite; the others' requests go into ``failed`` (the
    scheduler finishes them with an error and frees their blocks; the batch goes on)."""
    kept = []
    for i, (state, token) in enumerate(zip(states, tokens, strict=True)):
        error = invalid_token_error(token)
        if error is None:
            kept.append(i)
        else:
            failed[state.req_id] = error
    return (
        [states[i] for i in kept],
        [matchers[i] for i in kept],
        [tokens[i] for i in kept],
        [entries[i] for i in kept],
    )
