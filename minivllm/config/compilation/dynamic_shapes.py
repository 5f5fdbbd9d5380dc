"""How torch.compile treats the dynamic (token-count) dimension."""

from __future__ import annotations

import enum

from minivllm.config.utils import config, get_hash_factors, hash_factors


class DynamicShapesType(str, enum.Enum):
    """The kind of symbolic shapes torch.compile uses for the token dimension."""

    BACKED = "backed"
    """Backed symbols (PyTorch's default): Dynamo may guard on them and specialises 0, 1
    and >=2 even where the model never branches on them."""
    UNBACKED = "unbacked"
    """Unbacked symbols: never guarded on nor 0/1-specialised (the most sound choice),
    but code that branches on the value without unbacked handling raises a
    data-dependent error."""
    BACKED_SIZE_OBLIVIOUS = "backed_size_oblivious"
    """Experimental: backed symbols that are treated as unbacked wherever explicit
    unbacked handling exists."""


@config
class DynamicShapesConfig:
    """Controls (and helps debug) dynamic shapes under torch.compile."""

    type: DynamicShapesType = DynamicShapesType.BACKED
    """Which symbolic-shape kind to mark the token dimension with (see DynamicShapesType)."""

    evaluate_guards: bool = False
    """Debug aid: keep Dynamo's shape guards instead of dropping them and fail loudly if
    a recompilation is ever triggered by one, which reveals where the model specialises
    a dynamic size. With BACKED shapes this needs AOT compilation turned off."""

    assume_32_bit_indexing: bool = False
    """Let the compiler assume every tensor size fits 32-bit indexing (needs torch>=2.10)."""

    def compute_hash(self) -> str:
        """Every field changes the compiled graph, so every field is hashed."""
        return hash_factors(get_hash_factors(self, set()))


__all__ = ["DynamicShapesConfig", "DynamicShapesType"]
