"""The step's token bitmask, filled from the matchers of the constrained rows, under the
per-request time limits of `StructuredOutputsConfig` (max_mask_ms,
max_request_grammar_s): a request whose grammar breaks one ends alone, with an error,
and the batch goes on."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch

from minivllm.config.structured_outputs import StructuredOutputsConfig
from minivllm.logger import init_logger
from minivllm.structured_output.deadline import GrammarExecutor
from minivllm.structured_output.limits import flag
from minivllm.structured_output.spec import GRAMMAR_ERROR_PREFIX, GrammarMatcher

logger = init_logger(__name__)


class GrammarBitmask:
    """A reusable int32 bitmask buffer (32 tokens per word), grown on demand."""

    def __init__(
        self,
        vocab_size: int,
        device: torch.device,
        config: StructuredOutputsConfig | None = None,
    ) -> None:
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self.config = config or StructuredOutputsConfig()
        self._buffer = torch.empty(0, self.num_words, dtype=torch.int32)
        self._executor: GrammarExecutor | None = None

    def fill(
        self,
        matchers: list[GrammarMatcher | None],
        req_ids: list[str] | None = None,
        failed: dict[str, str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """``(rows, bitmask)`` for the rows with a live matcher (rows None = all rows), or
        None when no row is constrained this step.

        A row whose grammar breaks a limit or allows no token goes into ``failed``
        (request id -> error; its row of the mask allows everything, and its token must
        be dropped); without ``failed`` that is a ValueError.
        """
        live = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
        if not live:
            return None
        if self._buffer.shape[0] < len(live):
            self._buffer = torch.empty(len(live), self.num_words, dtype=torch.int32)
        bitmask = self._buffer[: len(live)]
        calls = [
            partial(_fill_row, matchers[row], bitmask, out_row) for out_row, row in enumerate(live)
        ]
        if self._executor is None:
            self._executor = GrammarExecutor()
        results = self._executor.run(calls, self.config.max_mask_ms / 1000)
        any_allowed = bitmask.any(dim=1).tolist()
        for out_row, (row, result) in enumerate(zip(live, results, strict=True)):
            matcher = matchers[row]
            if result.timed_out:
                # The abandoned call still writes into this buffer: the next step gets
                # a fresh one.
                self._buffer = torch.empty(0, self.num_words, dtype=torch.int32)
                error = (
                    "computing the token mask of its grammar took over max_mask_ms="
                    f"{self.config.max_mask_ms:g} ({flag('max_mask_ms')}); use a simpler "
                    "grammar (nested bounded repetitions such as (.{0,50}){0,50} are slow)"
                )
            else:
                error = _spent(matcher, result.seconds, self.config)
                if result.error is not None:
                    error = f"its grammar failed: {result.error}"
                elif error is None and not any_allowed[out_row]:
                    error = "its grammar allows no next token: it cannot be satisfied"
            if error is not None:
                bitmask[out_row].fill_(-1)
                _fail(matcher, req_ids[row] if req_ids else str(row), error, failed)
        rows = None
        if len(live) != len(matchers):
            rows = torch.tensor(live, dtype=torch.int64).to(self.device, non_blocking=True)
        return rows, bitmask.to(self.device, non_blocking=True)

    def accept(
        self,
        req_ids: list[str],
        matchers: list[GrammarMatcher | None],
        token_ids: list[int],
        failed: dict[str, str] | None = None,
    ) -> None:
        """Advance each live matcher over its row's sampled token, timed like the masks."""
        for req_id, matcher, token_id in zip(req_ids, matchers, token_ids, strict=True):
            if matcher is None or matcher.is_terminated() or req_id in (failed or {}):
                continue
            if getattr(matcher, "error", None) is not None:
                continue
            start = time.perf_counter()
            accepted = matcher.accept_token(token_id)
            error = _spent(matcher, time.perf_counter() - start, self.config)
            if error is not None:
                _fail(matcher, req_id, error, failed)
            elif not accepted:
                # Only reachable if a token outside the mask was sampled (a bug).
                logger.warning("request %s: grammar rejected token %d", req_id, token_id)


def accept_tokens(
    req_ids: list[str], matchers: list[GrammarMatcher | None], token_ids: list[int]
) -> None:
    """Advance each live matcher over its row's sampled token (no time limits)."""
    for req_id, matcher, token_id in zip(req_ids, matchers, token_ids, strict=True):
        if matcher is None or matcher.is_terminated():
            continue
        if not matcher.accept_token(token_id):
            logger.warning("request %s: grammar rejected token %d", req_id, token_id)


def _fill_row(matcher: Any, bitmask: torch.Tensor, row: int) -> None:
    if getattr(matcher, "error", None) is not None:
        raise RuntimeError(matcher.error)  # failed before; never fill it again
    matcher.fill_bitmask(bitmask, row)


def _spent(matcher: Any, seconds: float, config: StructuredOutputsConfig) -> str | None:
    """Charge ``seconds`` to the matcher's request; the error if it broke a limit."""
    spent = getattr(matcher, "spent_s", 0.0) + seconds
    if hasattr(matcher, "spent_s"):
        matcher.spent_s = spent
    if seconds * 1000 > config.max_mask_ms:
        return (
            f"one step of its grammar took {seconds * 1000:.0f} ms, over max_mask_ms="
            f"{config.max_mask_ms:g} ({flag('max_mask_ms')}); use a simpler grammar"
        )
    if spent > config.max_request_grammar_s:
        return (
            f"its grammar took {spent:.1f} s in all, over max_request_grammar_s="
            f"{config.max_request_grammar_s:g} ({flag('max_request_grammar_s')}); use a "
            "simpler grammar or fewer max_tokens"
        )
    return None


def _fail(matcher: Any, req_id: str, error: str, failed: dict[str, str] | None) -> None:
    error = GRAMMAR_ERROR_PREFIX + error
    if hasattr(matcher, "error"):
        matcher.error = error
    if failed is None:
        raise ValueError(error)
    logger.warning("request %s ends: %s", req_id, error)
    failed[req_id] = error
