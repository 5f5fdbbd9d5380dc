"""`ThinkingGate` on scripted token ids: where a request starts (from its prompt), the
thinking budget forcing the end marker token by token, and the step's constraint (the
grammar on the answer only), also after a preemption."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.reasoning import ReasoningMarkers, ThinkingGate
from minivllm.reasoning.gate import Phase
from minivllm.structured_output.reasoning_gate import ForcedTokenMatcher, step_matcher

START, END = (5,), (7, 8)  # a one-token start marker, a two-token end marker
MARKERS = ReasoningMarkers(START, END)


def gate(prompt: list[int], budget: int | None = None, markers=MARKERS) -> ThinkingGate:  # noqa: ANN001
    return ThinkingGate(markers, prompt, budget)


def run(g: ThinkingGate, model_tokens: list[int], steps: int) -> list[int]:
    """Generate ``steps`` tokens: the forced one when the gate forces, else the model's
    next scripted token."""
    out, script = [], iter(model_tokens)
    for _ in range(steps):
        forced = g.forced_token_id()
        token = forced if forced is not None else next(script)
        g.observe(token)
        out.append(token)
    return out


def test_the_prompt_decides_where_the_output_starts() -> None:
    assert gate([1, 2, 5, 3, 4]).phase is Phase.THINKING
    assert gate([1, 2, 5, 3, 4]).num_thinking == 2  # the template's tokens after <think>
    assert gate([1, 5, 3, 7, 8, 2]).phase is Phase.ANSWER  # thinking closed (enable_thinking off)
    assert gate([1, 5, 3, 7, 8, 5]).phase is Phase.THINKING  # the last marker counts
    assert gate([1, 2, 3]).phase is Phase.BEFORE
    assert gate([1, 7, 2]).phase is Phase.BEFORE  # half an end marker is no marker


def test_budget_forces_the_whole_end_marker_after_n_thinking_tokens() -> None:
    g = gate([1, 5], budget=3)
    assert run(g, [20, 21, 22, 23, 24], 7) == [20, 21, 22, 7, 8, 23, 24]
    assert g.answer_started
    # Budget 0: the end marker comes at once; the prompt's thinking tokens count too.
    assert run(gate([1, 5], budget=0), [20, 21], 3) == [7, 8, 20]
    assert run(gate([1, 5, 30, 31], budget=3), [20, 21], 4) == [20, 7, 8, 21]


def test_no_forcing_when_the_model_ends_in_time_or_never_thinks() -> None:
    g = gate([1, 5], budget=4)
    assert run(g, [20, 7, 8, 21, 22, 23, 24], 7) == [20, 7, 8, 21, 22, 23, 24]
    assert g.answer_started
    g = gate([1, 2], budget=1)  # no marker yet: nothing to count
    assert run(g, [20, 21, 22], 3) == [20, 21, 22] and g.phase is Phase.BEFORE
    # ... until the model opens its thinking itself.
    assert run(g, [5, 30, 31, 32], 4) == [5, 30, 7, 8]
    # A model that wrote half the end marker before the budget ran out still ends well.
    assert run(gate([1, 5], budget=2), [20, 7], 4) == [20, 7, 7, 8]


class FakeGrammar:
    """Stands in for a grammar matcher: records what it is fed."""

    def __init__(self) -> None:
        self.fed: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        self.fed.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].fill_(-1)


def test_the_grammar_constrains_the_answer_only() -> None:
    grammar = FakeGrammar()
    g = gate([1, 5], budget=2)
    seen = []
    for token in [20, 21, 7, 8, 40, 41]:
        constraint = step_matcher(g, grammar)
        seen.append(type(constraint).__name__)
        if constraint is not None:
            assert constraint.accept_token(token)
        g.observe(token)
    assert seen == ["NoneType", "NoneType"] + ["ForcedTokenMatcher"] * 2 + ["FakeGrammar"] * 2
    assert grammar.fed == [40, 41]
    # enable_in_reasoning: the grammar sees everything and nothing is forced over it.
    inside = ReasoningMarkers(START, END, gate_grammar=False)
    assert step_matcher(gate([1, 5], 0, inside), grammar) is grammar
    assert isinstance(step_matcher(gate([1, 5], 0, inside), None), ForcedTokenMatcher)
    assert step_matcher(None, grammar) is grammar


@pytest.mark.parametrize("token_id", [0, 5, 31, 32, 63, 100])
def test_forced_token_mask_allows_exactly_that_token(token_id: int) -> None:
    bitmask = torch.full((2, 4), -1, dtype=torch.int32)
    ForcedTokenMatcher(token_id).fill_bitmask(bitmask, 1)
    bits = np.unpackbits(bitmask[1].numpy().view(np.uint8), bitorder="little")
    assert np.flatnonzero(bits).tolist() == [token_id]
    assert (bitmask[0] == -1).all()


def test_worker_replays_reasoning_and_answer_after_a_preemption() -> None:
    from minivllm.sampling_params import SamplingParams
    from minivllm.scheduler.output import NewRequestData
    from minivllm.worker.input_batch import CachedRequestState

    grammar = FakeGrammar()

    class Compiled:
        def new_matcher(self) -> FakeGrammar:
            return grammar

    params = SamplingParams(thinking_token_budget=2)
    data = NewRequestData("r", [1, 5], params, [1], 2, [20, 21, 7, 8, 40], Compiled())
    state = CachedRequestState.from_new(data, torch.device("cpu"), MARKERS)
    assert grammar.fed == [40]  # the answer's tokens only
    assert state.thinking_gate is not None and state.thinking_gate.answer_started
    assert state.step_matcher() is grammar
    # Mid-marker: the rebuilt gate goes on forcing where it stopped.
    data = NewRequestData("r", [1, 5], params, [1], 2, [20, 21, 7], None)
    state = CachedRequestState.from_new(data, torch.device("cpu"), MARKERS)
    constraint = state.step_matcher()
    assert isinstance(constraint, ForcedTokenMatcher) and constraint.token_id == 8
    # Without a grammar or a budget a request gets no gate at all.
    plain = NewRequestData("r", [1, 5], SamplingParams(), [1], 2, [], None)
    assert CachedRequestState.from_new(plain, torch.device("cpu"), MARKERS).thinking_gate is None
