"""The worker side of speculative decoding: propose drafts (n-gram or draft model).

The draft model keeps its KV cache in the same blocks as the target (its own tensors,
indexed by the same block tables), so the scheduler's allocation, lookahead slots,
rollback and preemption cover both models.  Per request it remembers how many
positions of its cache hold the KV of the real tokens; after a verification step the
positions past the accepted tokens are recomputed by the next proposal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.layer import bind_kv_caches, get_attention_layers
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.paged_kv import allocate_kv_caches, kv_cache_bytes_per_block
from minivllm.logger import init_logger
from minivllm.model_executor.loader import load_model
from minivllm.sample.rejection_sampler import position_noise
from minivllm.sampling_params import SAMPLING_EPS
from minivllm.worker.input_batch import CachedRequestState
from minivllm.worker.ngram_proposer import NgramProposer
from minivllm.worker.weight_pages import log_placement, place_on_huge_pages

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class SpecDecoder:
    """Proposes draft tokens for the requests that sampled this step."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        spec = vllm_config.speculative_config
        assert spec is not None
        self.spec = spec
        self.vllm_config = vllm_config
        self.device = device
        self.max_model_len: int = vllm_config.model_config.max_model_len
        if spec.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, spec.max_model_len)
        self.ngram: NgramProposer | None = None
        if spec.use_ngram():
            assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
            self.ngram = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
        self.model: torch.nn.Module | None = None
        self.model_config: Any = None
        self.attn_layers: dict[str, Any] = {}
        self.kv_caches: list[torch.Tensor] = []
        # Per request: positions whose draft KV is valid, the drafts last proposed and
        # (unseeded random requests) the noise they were drawn with, which the
        # verification reuses so that draft and target share their randomness.
        self.num_computed: dict[str, int] = {}
        self.proposed: dict[str, tuple[list[int], torch.Tensor | None]] = {}

    # -- set-up -------------------------------------------------------------
    def load_model(self, target_vocab_size: int) -> None:
        if not self.spec.uses_draft_model():
            return
        from minivllm.config.model import ModelConfig

        target = self.vllm_config.model_config
        if self.spec.model == target.model:
            model_config = target
        else:
            # The draft is loaded dequantized (see `load_model` below), GGUF or not.
            model_config = ModelConfig(
                model=self.spec.model, dtype=target.dtype, quantization="none"
            )
        vocab = model_config.get_vocab_size()
        if vocab != target_vocab_size:
            raise ValueError(
                f"the draft model {self.spec.model!r} has a vocabulary of {vocab} tokens but "
                f"the target has {target_vocab_size}; the draft must share the target's "
                "tokenizer."
            )
        self.model_config = model_config
        self.spec.draft_model_config = model_config
        self.spec.target_model_config = target
        # Past its own context the draft's guesses are worthless: stop drafting there.
        if model_config.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, model_config.max_model_len)
        logger.info("speculative decoding: loading the draft model %s", model_config.model)
        # Loaded outside the current config, so its attention layers stay out of the
        # target's forward context (same layer names).
        self.model = load_model(
            model_config.model,
            model_config.hf_config,
            target.dtype,
            load_format=self.vllm_config.load_config.load_format,
            device=self.device,
        ).eval()
        if self.device.type == "cpu":
            log_placement(place_on_huge_pages(self.model))
        self.attn_layers = get_attention_layers(self.model)

    def kv_cache_bytes_per_block(self, block_size: int) -> int:
        if self.model is None:
            return 0
        model_config = self.model_config
        return kv_cache_bytes_per_block(
            block_size,
            model_config.get_total_num_kv_heads(),
            model_config.get_head_size(),
            model_config.dtype,
            num_layers=len(self.attn_layers),
        )

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        if self.model is None:
            return
        model_config = self.model_config
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(
            len(self.attn_layers),
            num_blocks,
            block_size,
            model_config.get_total_num_kv_heads(),
            model_config.get_head_size(),
            model_config.dtype,
            self.device,
        )
        bind_kv_caches(self.attn_layers, self.kv_caches)

    # -- per step -----------------------------------------------------------
    def forget(self, req_id: str) -> None:
        self.num_computed.pop(req_id, None)
        self.proposed.pop(req_id, None)

    def take_draft_noise(
        self, req_ids: list[str], drafts: list[list[int]]
    ) -> list[torch.Tensor | None] | None:
        """The noise the drafts verified now were sampled with (None where the draft
        is deterministic or the request seeded, whose noise is keyed by position)."""
        if self.model is None:
            return None
        out: list[torch.Tensor | None] = []
        for req_id, req_drafts in zip(req_ids, drafts, strict=True):
            tokens, noise = self.proposed.pop(req_id, ([], None))
            ok = noise is not None and req_drafts and tokens[: len(req_drafts)] == req_drafts
            out.append(noise[: len(req_drafts)] if ok else None)  # type: ignore[index]
        return out

    def propose(self, states: list[CachedRequestState], k: int) -> dict[str, list[int]]:
        """Up to ``k`` drafts per request, continuing its tokens (outputs included)."""
        if self.ngram is not None:
            out = {}
            for state in states:
                room = min(k, self.max_model_len - state.num_tokens)
                if room > 0:
                    out[state.req_id] = self.ngram.propose(
                        state.prompt_token_ids + state.output_token_ids, room
                    )
            return out
        return self._propose_with_model(states, k)

    @torch.inference_mode()
    def _propose_with_model(self, states: list[CachedRequestState], k: int) -> dict[str, list[int]]:
        assert self.model is not None
        jobs: list[tuple[CachedRequestState, int]] = []
        for state in states:
            # The drafter writes KV up to position num_tokens + room - 2.
            capacity = len(state.block_ids) * self.block_size
            room = min(k, self.max_model_len - state.num_tokens, capacity - state.num_tokens + 1)
            if room > 0:
                jobs.append((state, room))
        if not jobs:
            return {}
        drafts: dict[str, list[int]] = {s.req_id: [] for s, _ in jobs}
        noises: dict[str, list[torch.Tensor]] = {s.req_id: [] for s, _ in jobs}
        # First forward: every token the drafter has not seen (at least the newest).
        items = []
        for state, _ in jobs:
            start = min(self.num_computed.get(state.req_id, 0), state.num_tokens - 1)
            items.append((state, start, state.token_slice(start, state.num_tokens)))
        for step in range(max(room for _, room in jobs)):
            logits = self._forward(items)
            next_items = []
            for (state, start, tokens), row in zip(items, logits, strict=True):
                token, noise = self._draw(state, row, len(drafts[state.req_id]))
                drafts[state.req_id].append(token)
                if noise is not None:
                    noises[state.req_id].append(noise)
                self.num_computed[state.req_id] = start + len(tokens)
                room = next(r for s, r in jobs if s is state)
                if step + 1 < room:
                    next_items.append((state, start + len(tokens), [token]))
            items = next_items
            if not items:
                break
        for state, _ in jobs:
            rid = state.req_id
            self.proposed[rid] = (drafts[rid], torch.stack(noises[rid]) if noises[rid] else None)
        return drafts

    def _draw(
        self, state: CachedRequestState, logits: torch.Tensor, index: int
    ) -> tuple[int, torch.Tensor | None]:
        """The draft token at the request's next output position + ``index``, and the
        noise it was drawn with when the verification cannot recompute it."""
        params = state.sampling_params
        if params.temperature < SAMPLING_EPS or self.spec.draft_sample_method == "greedy":
            return int(logits.argmax()), None
        q = (logits.float() / params.temperature).softmax(dim=-1)
        if params.seed is not None:
            position = len(state.output_token_ids) + index
            noise = position_noise(params.seed, position, q.shape[0], self.device)
            return int((q / noise).argmax()), None
        noise = torch.empty_like(q).exponential_()
        return int((q / noise).argmax()), noise

    def _forward(self, items: list[tuple[CachedRequestState, int, list[int]]]) -> torch.Tensor:
        """The draft's logits after the last token of each item (start, tokens)."""
        assert self.model is not None
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens = []
        width = max(len(state.block_ids) for state, _, _ in items)
        tables = np.zeros((len(items), width), dtype=np.int32)
        for i, (state, start, tokens) in enumerate(items):
            pos = np.arange(start, start + len(tokens))
            blocks = np.asarray(state.block_ids, dtype=np.int64)
            ids.extend(tokens)
            positions.extend(pos.tolist())
            slots.extend((blocks[pos // bs] * bs + pos % bs).tolist())
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(start + len(tokens))
            tables[i, : len(state.block_ids)] = state.block_ids
        dev = self.device
        attn_metadata = AttentionMetadata(
            num_actual_tokens=len(ids),
            max_query_len=max(len(t) for _, _, t in items),
            max_seq_len=max(seq_lens),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.from_numpy(tables).to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
        )
        with set_forward_context(attn_metadata, self.attn_layers):
            hidden = self.model(
                torch.tensor(ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
            )
        last = torch.tensor([s - 1 for s in starts[1:]], dtype=torch.long, device=dev)
        return self.model.compute_logits(hidden[last])
