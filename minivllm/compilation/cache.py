"""The on-disk cache of compiled pieces.

Layout: ``<cache_dir>/rank_<r>/<prefix>/`` holds one artifact per compiled entry
(``artifact_<key>`` written by Inductor's `CompiledArtifact.save` in
``compile_cache_save_format``) and ``cache_index.json`` mapping each entry key to
its artifact; ``pieces.json`` records, per split graph, the entries each of its
pieces uses (so a warm start installs them without tracing shapes).  The default ``cache_dir`` is
``<cache root>/torch_compile_cache/<VllmConfig.compute_hash()>``, so a changed
hashed config field lands in a fresh directory and recompiles, while an unhashed
field (KV-cache size, logging, ...) reuses the artifacts.  An entry key hashes the
piece's graph, so edited model code misses instead of loading a stale kernel.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minivllm import envs
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

INDEX_FILE = "cache_index.json"
PIECES_FILE = "pieces.json"


def default_cache_dir(vllm_config: VllmConfig) -> Path:
    """``<cache root>/torch_compile_cache/<config hash>``: one directory per config."""
    return envs.cache_root() / "torch_compile_cache" / vllm_config.compute_hash()


def local_cache_dir(vllm_config: VllmConfig, prefix: str, record: bool = True) -> Path:
    """This rank's directory for the module ``prefix``; also recorded in the config
    (``compilation_config.local_cache_dir``) unless ``record`` is False."""
    compilation_config = vllm_config.compilation_config
    base = (
        Path(compilation_config.cache_dir).expanduser()
        if compilation_config.cache_dir
        else default_cache_dir(vllm_config)
    )
    rank = vllm_config.parallel_config.rank
    path = base / f"rank_{rank}" / (prefix or "model")
    if record:
        compilation_config.local_cache_dir = str(path)
    return path


class CompileCache:
    """Artifacts of compiled pieces under one directory, found through an index file."""

    def __init__(self, directory: Path, save_format: str) -> None:
        self.directory = directory
        self.save_format = save_format
        self.index_path = directory / INDEX_FILE
        self.index: dict[str, str] = {}
        if self.index_path.is_file():
            try:
                self.index = json.loads(self.index_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                logger.warning(
                    "ignoring unreadable compile cache index %s: %s", self.index_path, exc
                )

    def load(self, key: str) -> Any | None:
        """The compiled artifact stored under ``key``, or None on a miss."""
        name = self.index.get(key)
        if name is None:
            return None
        path = self.directory / name
        if not path.exists():
            return None
        from torch._inductor import CompiledArtifact

        try:
            return CompiledArtifact.load(path=str(path), format=self.save_format)
        except Exception as exc:  # a corrupt or incompatible artifact is only a miss
            logger.warning("could not load compiled artifact %s (%s); recompiling", path, exc)
            return None

    def recorded_pieces(self, fingerprint: str) -> dict[str, Any] | None:
        """The pieces recorded for the split graph ``fingerprint`` (`record_pieces`)."""
        try:
            return json.loads((self.directory / PIECES_FILE).read_text()).get(fingerprint)
        except (OSError, ValueError, AttributeError):
            return None

    def record_pieces(self, fingerprint: str, pieces: dict[str, Any]) -> None:
        """Remember which entries each piece of the graph ``fingerprint`` uses, so a
        later start can install them without running the graph on fake inputs."""
        path = self.directory / PIECES_FILE
        try:
            known = json.loads(path.read_text()) if path.is_file() else {}
            if not isinstance(known, dict):
                known = {}
        except (OSError, ValueError):
            known = {}
        known[fingerprint] = pieces
        try:
            self._write_json(path, known)
        except OSError as exc:  # only a later start's shortcut is lost
            logger.warning("could not record the compiled pieces in %s: %s", path, exc)

    def _write_json(self, path: Path, value: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".index")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=1, sort_keys=True)
        os.replace(tmp, path)

    def save(self, key: str, artifact: Any) -> None:
        """Write ``artifact`` and record it in the index (atomically replaced)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"artifact_{key}"
        artifact.save(path=str(self.directory / name), format=self.save_format)
        self.index[key] = name
        self._write_json(self.index_path, self.index)


__all__ = ["CompileCache", "default_cache_dir", "local_cache_dir"]
