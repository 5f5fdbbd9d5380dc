"""What a stored KV block must match to be loaded: the model and the KV layout.

Block files and transferred blocks carry a layout id; a block written by another
model, dtype or block size never matches, so it is a miss rather than garbage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


@dataclass(frozen=True)
class KVLayout:
    """The shape of one KV block over all layers: ``[layers, 2, block_size, heads, dim]``."""

    model: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_size: int

    @classmethod
    def from_config(cls, vllm_config: VllmConfig) -> KVLayout:
        model = vllm_config.model_config
        assert model is not None and vllm_config.cache_config.block_size is not None
        cache_dtype = vllm_config.cache_config.cache_dtype
        dtype = _CACHE_DTYPES.get(cache_dtype, cache_dtype)
        if dtype == "auto":
            dtype = str(model.dtype).removeprefix("torch.")
        return cls(
            model=str(model.model),
            dtype=dtype,
            block_size=vllm_config.cache_config.block_size,
            num_layers=model.get_total_num_hidden_layers(),
            num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
            head_size=model.get_head_size(),
        )

    @property
    def layout_id(self) -> str:
        """A short stable id of the layout (directory name, wire check)."""
        text = repr((self.model, self.dtype, self.block_size, self.num_layers,
                     self.num_kv_heads, self.head_size))  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def bytes_per_block(self) -> int:
        elem = _DTYPE_BYTES.get(self.dtype, 2)
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_size * elem
