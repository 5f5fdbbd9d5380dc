"""The worker half of a connector: moves KV blocks in and out of the KV tensors.

The model runner calls, each step: `bind_connector_metadata` (the scheduler's
`KVConnectorMetadata`), `start_load_kv` before the forward pass (loads run on a
background thread into blocks no scheduled request uses, so the batch does not
wait), `wait_for_layer_load` per layer (nothing to wait for: no layer of this
step reads a block being loaded), `save_kv_layer` per layer and `wait_for_save`
after the forward pass (a block holds every layer, so the blocks are written
once all layers are in), then `get_finished` (the loads that ended, for the
scheduler).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from minivllm.kv_transfer.base import KVConnectorMetadata, KVConnectorOutput, KVLoad, KVSave
from minivllm.kv_transfer.block_codec import decode_block, encode_block
from minivllm.kv_transfer.layout import KVLayout
from minivllm.logger import init_logger
from minivllm.stats import KVConnectorStats

logger = init_logger(__name__)


class LoadFailed(RuntimeError):
    """A load that produced nothing usable; the message is the request's error."""


class KVConnectorWorker:
    """Base of the worker halves: the KV tensors, the load thread, the step's stats."""

    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        self.layers: list[torch.Tensor] = []
        self.layer_names: list[str] = []
        self._meta = KVConnectorMetadata()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-load")
        self._loading: dict[str, Future[int]] = {}
        self._lock = threading.Lock()
        self._stats = KVConnectorStats()
        self._corrupt: list[str] = []

    # -- set-up ---------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Every layer's KV tensor ``[2, num_blocks, block_size, heads, dim]``, in order."""
        self.layer_names = list(kv_caches)
        self.layers = list(kv_caches.values())
        assert len(self.layers) == self.layout.num_layers, "one KV tensor per layer"

    @property
    def block_shape(self) -> tuple[int, ...]:
        _, _, bs, heads, dim = self.layers[0].shape
        return (len(self.layers), 2, bs, heads, dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].dtype

    # -- per step -------------------------------------------------------------
    def bind_connector_metadata(self, meta: KVConnectorMetadata | None) -> None:
        self._meta = meta or KVConnectorMetadata()

    def start_load_kv(self) -> None:
        for load in self._meta.loads:
            self._loading[load.req_id] = self._pool.submit(self._timed_load, load)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads write only blocks no request of this step reads."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor) -> None:
        """A block file holds every layer: the blocks are written in `wait_for_save`."""

    def wait_for_save(self) -> None:
        start = time.perf_counter()
        for save in self._meta.saves:
            self.save(save)
        with self._lock:
            self._stats.save_time_s += time.perf_counter() - start
        self.drop(self._meta)

    def get_finished(
        self, finished_req_ids: set[str] | None = None, wait_s: float = 0.0
    ) -> KVConnectorOutput:
        """Loads that ended since the last call, with the step's counts; ``wait_s``: how
        long to wait for one when none has ended yet."""
        if wait_s and self._loading:
            wait(self._loading.values(), timeout=wait_s, return_when=FIRST_COMPLETED)
        out = KVConnectorOutput()
        for req_id, future in list(self._loading.items()):
            if not future.done():
                continue
            del self._loading[req_id]
            try:
                out.finished_loads[req_id] = future.result()
            except Exception as exc:  # a failed load fails its request alone
                with self._lock:
                    self._stats.num_failed_loads += 1
                out.failed_loads[req_id] = str(exc) if isinstance(exc, LoadFailed) else repr(exc)
        with self._lock:
            out.stats, self._stats = self._stats, KVConnectorStats()
            out.corrupt_keys, self._corrupt = self._corrupt, []
        return out

    def has_pending_loads(self) -> bool:
        return bool(self._loading)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- what each connector does ---------------------------------------------
    def load(self, load: KVLoad) -> int:
        """Fill the load's blocks; returns the tokens loaded (a prefix)."""
        raise NotImplementedError

    def save(self, save: KVSave) -> None:
        raise NotImplementedError

    def drop(self, meta: KVConnectorMetadata) -> None:
        """Apply the scheduler half's evictions."""

    # -- helpers ----------------------------------------------------------------
    def _timed_load(self, load: KVLoad) -> int:
        start = time.perf_counter()
        try:
            return self.load(load)
        finally:
            with self._lock:
                self._stats.load_time_s += time.perf_counter() - start

    def gather_block(self, block_id: int) -> torch.Tensor:
        return torch.stack([kv[:, block_id] for kv in self.layers])

    def scatter_block(self, block_id: int, block: torch.Tensor) -> None:
        for kv, part in zip(self.layers, block, strict=True):
            kv[:, block_id].copy_(part)

    def count_loaded(self, num_blocks: int, num_bytes: int) -> None:
        with self._lock:
            self._stats.num_loaded_blocks += num_blocks
            self._stats.num_loaded_bytes += num_bytes

    def count_saved(self, num_blocks: int, num_bytes: int) -> None:
        with self._lock:
            self._stats.num_saved_blocks += num_blocks
            self._stats.num_saved_bytes += num_bytes

    def count_corrupt(self, key: str, why: str) -> None:
        logger.warning("KV block %s is corrupt (%s): treated as a miss, deleted", key, why)
        with self._lock:
            self._stats.num_corrupt_blocks += 1
            self._corrupt.append(key)

    def decode(self, data: bytes, key: str) -> torch.Tensor:
        return decode_block(data, key, self.layout.layout_id, self.dtype, self.block_shape)

    def encode(self, key: str, block_id: int) -> bytes:
        return encode_block(key, self.layout.layout_id, self.gather_block(block_id))
