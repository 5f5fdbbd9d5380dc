"""The step's token bitmask, filled from the matchers of the constrained rows."""

from __future__ import annotations

import torch

from minivllm.logger import init_logger
from minivllm.structured_output.spec import GrammarMatcher

logger = init_logger(__name__)


class GrammarBitmask:
    """A reusable int32 bitmask buffer (32 tokens per word), grown on demand."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._buffer = torch.empty(0, self.num_words, dtype=torch.int32)

    def fill(
        self, matchers: list[GrammarMatcher | None]
    ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """``(rows, bitmask)`` for the rows with a live matcher (rows None = all rows), or
        None when no row is constrained this step."""
        live = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
        if not live:
            return None
        if self._buffer.shape[0] < len(live):
            self._buffer = torch.empty(len(live), self.num_words, dtype=torch.int32)
        bitmask = self._buffer[: len(live)]
        for out_row, row in enumerate(live):
            matcher = matchers[row]
            assert matcher is not None
            matcher.fill_bitmask(bitmask, out_row)
        rows = None
        if len(live) != len(matchers):
            rows = torch.tensor(live, dtype=torch.int64).to(self.device, non_blocking=True)
        return rows, bitmask.to(self.device, non_blocking=True)


def accept_tokens(
    req_ids: list[str], matchers: list[GrammarMatcher | None], token_ids: list[int]
) -> None:
    """Advance each live matcher over its row's sampled token."""
    for req_id, matcher, token_id in zip(req_ids, matchers, token_ids, strict=True):
        if matcher is None or matcher.is_terminated():
            continue
        if not matcher.accept_token(token_id):
            # Only reachable if a token outside the mask was sampled (a bug).
            logger.warning("request %s: grammar rejected token %d", req_id, token_id)
