"""`ThinkingGate`: one request's place relative to its reasoning section, by token ids.

The engine uses it for two things (vLLM's behaviour):

- a structured-output grammar constrains only the answer: it starts with the token
  after the end marker (``answer_started``), so the model thinks freely first;
- ``thinking_token_budget``: once the reasoning holds that many tokens the end
  marker is forced, token by token (``forced_token_id``), and the answer follows.

Where it starts is read from the prompt, as vLLM does: a start marker after the
last end marker means the template opened the thinking (Qwen3, DeepSeek R1); an end
marker last means the thinking is already closed (Qwen3 with ``enable_thinking:
false``), so the answer starts at once; no marker means the model has yet to open it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class ReasoningMarkers:
    """The token ids of the reasoning markers (from `ReasoningConfig`)."""

    start_token_ids: tuple[int, ...]
    end_token_ids: tuple[int, ...]
    gate_grammar: bool = True
    """A grammar constrains only the answer (False: the reasoning too, vLLM's
    ``enable_in_reasoning``)."""


class Phase(Enum):
    """Where the generation is."""

    BEFORE = "before"
    """No marker yet: the model may still open its reasoning."""
    THINKING = "thinking"
    """Inside the reasoning section."""
    ANSWER = "answer"
    """After the end marker (final: the answer does not reopen the gate)."""


def _last_index(token_ids: Sequence[int], marker: tuple[int, ...]) -> int:
    """Where ``marker`` last starts in ``token_ids``, or -1."""
    size = len(marker)
    for i in range(len(token_ids) - size, -1, -1):
        if tuple(token_ids[i : i + size]) == marker:
            return i
    return -1


class ThinkingGate:
    """Follows one request's tokens: the phase, the reasoning length, the forced end."""

    def __init__(
        self,
        markers: ReasoningMarkers,
        prompt_token_ids: Sequence[int],
        thinking_token_budget: int | None = None,
    ) -> None:
        self.markers = markers
        self.budget = thinking_token_budget
        start, end = markers.start_token_ids, markers.end_token_ids
        last_start = _last_index(prompt_token_ids, start)
        last_end = _last_index(prompt_token_ids, end)
        self.num_thinking = 0
        """Tokens of the reasoning so far (those after the start marker)."""
        if last_start > last_end:
            self.phase = Phase.THINKING
            self.num_thinking = len(prompt_token_ids) - last_start - len(start)
        else:
            self.phase = Phase.ANSWER if last_end >= 0 else Phase.BEFORE
        self._num_forced = 0
        self._window = max(len(start), len(end))
        self._tail = list(prompt_token_ids[-self._window :])

    @property
    def answer_started(self) -> bool:
        """The end marker is behind: a grammar on the answer applies to the next token."""
        return self.phase is Phase.ANSWER

    def forced_token_id(self) -> int | None:
        """The token the next step must produce (the budget is spent and the end marker
        is being written), or None."""
        if self.phase is not Phase.THINKING or self.budget is None:
            return None
        if self.num_thinking < self.budget and not self._num_forced:
            return None
        end = self.markers.end_token_ids
        return end[min(self._num_forced, len(end) - 1)]

    def observe(self, token_id: int) -> None:
        """Advance over one generated token."""
        if self.phase is Phase.ANSWER:
            return
        if self.forced_token_id() is not None:
            self._num_forced += 1
        self._tail = [*self._tail, token_id][-self._window :]
        if self._ends_with(self.markers.end_token_ids):
            self.phase = Phase.ANSWER
        elif self._ends_with(self.markers.start_token_ids):
            self.phase, self.num_thinking, self._num_forced = Phase.THINKING, 0, 0
        elif self.phase is Phase.THINKING:
            self.num_thinking += 1

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        return len(self._tail) >= len(marker) and tuple(self._tail[-len(marker) :]) == marker
