"""`LoggingConfig`: what the engine logs.

(This module is ``minivllm.config.logging``; with absolute imports it does not
shadow the standard library's ``logging`` anywhere.)
"""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config, hash_factors

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@config
class LoggingConfig:
    """Configuration for logging."""

    log_level: LogLevel | None = None
    """Level of the ``minivllm`` loggers. None: ``MINIVLLM_LOGGING_LEVEL`` (INFO)."""
    disable_log_stats: bool = False
    """Do not log periodic throughput and cache statistics."""
    log_stats_interval_s: float = 10.0
    """Seconds between two statistics lines."""
    enable_log_requests: bool = False
    """Log every request (prompt, sampling parameters)."""
    max_log_len: int | None = None
    """Longest prompt text or token list printed per logged request (None: all)."""
    log_error_stack: bool = False
    """Log the stack trace of errors returned to clients."""

    def __post_init__(self) -> None:
        if self.log_stats_interval_s <= 0:
            raise ValueError(
                f"log_stats_interval_s must be positive, got {self.log_stats_interval_s}"
            )
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"max_log_len must be >= 0 or None, got {self.max_log_len}")

    def check_supported(self) -> None:
        """Every logging setting is supported."""

    def compute_hash(self) -> str:
        """Logging does not change the compiled graph: no factors."""
        return hash_factors([])
