"""Constraints of a reasoning model's request, step by step: its grammar applies only
after the reasoning (`ThinkingGate.answer_started`), and a spent thinking budget forces
the end marker's tokens one by one, through the same token bitmask as a grammar."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from minivllm.config.vllm import VllmConfig
    from minivllm.reasoning import ReasoningMarkers, ThinkingGate
    from minivllm.structured_output.spec import GrammarMatcher


class ForcedTokenMatcher:
    """A one-step "grammar" that allows exactly one token."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        import torch

        word, bit = divmod(self.token_id, 32)
        # A grammar thread fills the step's buffer, made under the runner's inference mode.
        with torch.inference_mode():
            bitmask[row].zero_()
            # Bit 31 is the int32 sign bit.
            bitmask[row, word] = (1 << bit) - (1 << 32 if bit == 31 else 0)

    def accept_token(self, token_id: int) -> bool:
        return token_id == self.token_id  # the gate itself advances (observe)

    def is_terminated(self) -> bool:
        return False


def step_matcher(
    gate: ThinkingGate | None, grammar: GrammarMatcher | None
) -> GrammarMatcher | ForcedTokenMatcher | None:
    """What constrains the request's next token: the forced end-marker token, its
    grammar (answer only, unless the gate lets it into the reasoning), or nothing."""
    if gate is None:
        return grammar
    forced = gate.forced_token_id()
    if forced is not None and (grammar is None or gate.markers.gate_grammar):
        return ForcedTokenMatcher(forced)
    if grammar is not None and gate.markers.gate_grammar and not gate.answer_started:
        return None
    return grammar


def reasoning_markers(vllm_config: VllmConfig) -> ReasoningMarkers | None:
    """The engine's reasoning markers (token ids found when it started), or None."""
    reasoning = vllm_config.reasoning_config
    if reasoning is None:
        return None
    return reasoning.markers(not vllm_config.structured_outputs_config.enable_in_reasoning)
