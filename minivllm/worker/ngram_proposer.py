"""Prompt lookup (the ``ngram`` speculative method): drafts copied from the context.

For output that repeats its input (rewriting, summarising, editing code), the tokens
after an earlier occurrence of the context's last n tokens are a good guess of what
comes next.  The longest n in ``[prompt_lookup_min, prompt_lookup_max]`` with a match
wins; among its matches the latest one that has ``k`` tokens after it (the most recent
continuation), else the earliest.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Proposes up to ``k`` draft tokens per request by n-gram matching on the CPU."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Drafts that follow the context ``token_ids`` (may be fewer than ``k``, or none)."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        length = len(tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # Windows that start before the suffix itself: starts 0 .. length - n - 1.
            windows = sliding_window_view(tokens[: length - 1], n)
            hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
            if hits.size:
                # The latest match with k tokens after it, else the earliest (the longest).
                full = hits[hits + n + k <= length]
                start = int(full[-1] if full.size else hits[0]) + n
                return tokens[start : start + k].tolist()
        return []
