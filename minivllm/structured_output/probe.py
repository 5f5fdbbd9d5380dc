"""`GrammarProber`: runs a freshly compiled grammar through its first steps at
validation, so that a grammar too slow to enforce, or one that accepts nothing, is a
400 before it ever reaches the engine's shared step.

The probe walks the grammar with its shortest allowed (non-stop) token each step: the
cost of a slow grammar's mask grows with every character generated (about 1.5x a
character for ``(.{0,20}){0,20}`` in xgrammar), so short steps find the first mask over
the limit while it is still close to the limit, and the abandoned call that overran
stops soon after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minivllm.structured_output.deadline import run_with_deadline
from minivllm.structured_output.limits import flag

if TYPE_CHECKING:
    from minivllm.config.structured_outputs import StructuredOutputsConfig
    from minivllm.structured_output.spec import CompiledGrammar

_NEVER = 1e9
"""Cost of a token the probe never takes (stop tokens, ids past the tokenizer)."""


class GrammarProber:
    """Probes compiled grammars for one tokenizer (thread-safe: no shared mutable state)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        config: StructuredOutputsConfig,
    ) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self._cost = torch.full((vocab_size,), _NEVER)
        try:
            pieces = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
            lengths = [len(p) if isinstance(p, str) else _NEVER for p in pieces]
            self._cost[: len(lengths)] = torch.tensor(lengths, dtype=torch.float32)
        except (AttributeError, TypeError):  # no piece strings: every token costs the same
            self._cost[:] = 1.0
        for token_id in stop_token_ids:
            if 0 <= token_id < vocab_size:
                self._cost[token_id] = _NEVER
        self._shifts = torch.arange(32, dtype=torch.int32)

    def probe(self, grammar: CompiledGrammar, what: str) -> None:
        """ValueError when a mask of the first ``probe_steps`` steps takes over
        max_mask_ms or allows no token at all, or when the last one still takes over half
        of max_mask_ms (a cost that grows with the output)."""
        steps = self.config.probe_steps
        if steps == 0:
            return
        limit_s = self.config.max_mask_ms / 1000
        matcher = grammar.new_matcher()
        bitmask = torch.zeros(1, self.num_words, dtype=torch.int32)
        last_mask_s = 0.0
        gen = torch.Generator().manual_seed(0)
        for step in range(steps):
            result = run_with_deadline(lambda: matcher.fill_bitmask(bitmask, 0), limit_s)
            last_mask_s = result.seconds
            if result.timed_out or result.seconds > limit_s:
                raise ValueError(
                    f"the {what} is too slow to enforce: computing its token mask took "
                    f"over max_mask_ms={self.config.max_mask_ms:g} after {step} token(s) "
                    f"({flag('max_mask_ms')}); use a simpler one (nested bounded "
                    "repetitions such as (.{0,50}){0,50} are slow)"
                )
            if result.error is not None:
                raise ValueError(f"invalid {what} for structured outputs: {result.error}")
            bits = (bitmask[0].unsqueeze(-1) >> self._shifts) & 1
            allowed = bits.flatten()[: self.vocab_size].bool()
            if not bool(allowed.any()):
                raise ValueError(
                    f"the {what} accepts no output (no token can "
                    f"{'start' if step == 0 else 'continue'} it): it cannot be satisfied"
                )
            # The shortest allowed token, ties broken at random (seeded: reproducible).
            noise = torch.rand(self.vocab_size, generator=gen) * 0.5
            cost = torch.where(allowed, self._cost + noise, torch.inf)
            token_id = int(cost.argmin())
            if float(cost[token_id]) >= _NEVER:
                return  # only a stop token is left: the grammar is complete
            result = run_with_deadline(lambda t=token_id: matcher.accept_token(t), limit_s)
            if result.timed_out or result.seconds > limit_s:
                raise ValueError(
                    f"the {what} is too slow to enforce: advancing it over one token took "
                    f"over max_mask_ms={self.config.max_mask_ms:g} ({flag('max_mask_ms')}); "
                    "use a simpler one"
                )
            if result.error is not None or not result.value:
                return  # the library disagrees with its own mask; leave it to the engine
        if last_mask_s > limit_s / 2:
            # A mask already past half the limit after a few tokens is one whose cost
            # grows with the output (nested repetitions): it would pass the limit a few
            # tokens later, inside the engine's shared step.
            raise ValueError(
                f"the {what} is too slow to enforce: its token mask took "
                f"{last_mask_s * 1000:.0f} ms after only {steps} token(s), over half of "
                f"max_mask_ms={self.config.max_mask_ms:g} ({flag('max_mask_ms')}), and "
                "grows with the output; use a simpler one (nested bounded repetitions such "
                "as (.{0,50}){0,50} are slow)"
            )
