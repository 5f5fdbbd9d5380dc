"""Where encoded KV blocks live: a directory of block files, or host memory.

Torch-free (bytes in, bytes out): the scheduler half of a storage connector asks a
directory which keys it holds; the worker half reads and writes the blocks.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

SUFFIX = ".kvblock"


class DiskBlockStore:
    """One file per block, ``<root>/<key[:2]>/<key>.kvblock``, written atomically."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def contains(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        path.parent.mkdir(exist_ok=True)
        # A reader never sees half a file: write aside, then rename over.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def scan(self) -> list[str]:
        """The keys on disk, least recently written first."""
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                found.append((path.stat().st_mtime, path.name.removesuffix(SUFFIX)))
            except FileNotFoundError:
                continue
        return [key for _, key in sorted(found)]


class HostBlockStore:
    """Blocks in host memory (the offload tier's first level); thread-safe."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def contains(self, key: str) -> bool:
        return key in self._blocks

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._blocks.get(key)

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._blocks[key] = data

    def delete(self, key: str) -> None:
        with self._lock:
            self._blocks.pop(key, None)

    def __len__(self) -> int:
        return len(self._blocks)
