"""`ReasoningConfig`: reasoning (thinking) models. Not supported by minivllm."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from minivllm.config.utils import UnsupportedFeature, config

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig


@config
class ReasoningConfig(UnsupportedFeature):
    """Configuration for reasoning models (thinking budgets, think tokens)."""

    FEATURE: ClassVar[str] = "reasoning models (reasoning_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    reasoning_parser: str = ""
    """Parser that splits reasoning from the answer."""
    reasoning_start_str: str | None = None
    """Text that opens the reasoning section (e.g. "<think>")."""
    reasoning_end_str: str | None = None
    """Text that closes the reasoning section."""

    @property
    def enabled(self) -> bool:
        """Whether think-token ids are known (never, here)."""
        return False

    def initialize_token_ids(self, model_config: ModelConfig) -> None:
        self.check_supported()
