"""A GGUF model run on low-bit holds no more bytes than the file's tensors: an int8
LM head's rows are the only copy of its table (the file's blocks are not kept
beside them), and a tied embedding looks its rows up there.

Issue 25 caps resident memory at 1.3x the file; Gemma 3 270M's tied 262k x 640
Q8_0 table is 70% of its file, so a second copy of it alone broke the cap
(``benchmarks/memory.py`` measures the shipped models).  The values are checked
against the ``gguf`` package's own dequantization of the file.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from gguf_helpers import write_tiny_gguf

from minivllm.model_executor.layers.quantized_linear import INT8, PLAIN_TABLE
from minivllm.model_executor.loader import load_model
from minivllm.transformers_utils.config import get_hf_config


def file_tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def file_values(tensor: gguf.ReaderTensor) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())


def held_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the modules' parameters and buffers, each storage once."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for m in modules
        for t in [*m.parameters(), *m.buffers()]
    }
    return sum(storages.values())


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_int8_head_table_is_held_once(tmp_path: Path, tie: bool) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(path), tie=tie, all_q8_0=True)  # every matrix Q8_0
    model = load_model(path, get_hf_config(str(path)), torch.float32, quantization="gguf")
    tensors = file_tensors(path)
    head, embed = model.lm_head, model.model.embed_tokens
    # int8 rows (8 bits + a scale per row) for Q8_0 blocks (8.5 bits): the pair
    # holds fewer bytes than the file's tables; a kept second copy would double one.
    tables = [t for name, t in tensors.items() if name in ("token_embd.weight", "output.weight")]
    assert held_bytes(embed, head) <= sum(t.n_bytes for t in tables)
    assert head.quant_kind == INT8 and head.qtable is head.qweight
    ids = torch.tensor([0, 5, 64, 127, 5])
    table = file_values(tensors["token_embd.weight"])
    if tie:
        assert embed.qtable is head.qweight and embed.qtype == PLAIN_TABLE
        # The file's values re-quantized with one scale per row: within half a step.
        step = head.qscales.float()[ids, None]
        assert ((embed(ids) - table[ids]).abs() <= step / 2 + 1e-6).all()
        assert (embed(ids) != table[ids]).any()  # (not the file's blocks read as such)
    else:
        assert torch.equal(embed(ids), table[ids])  # the file's blocks, exactly
