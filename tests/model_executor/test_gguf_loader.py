"""GGUF loading: names, llama.cpp Q/K un-permutation, dequantization, weight cache."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf_helpers import write_tiny_gguf
from mx_helpers import PagedRunner
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from minivllm.model_executor.loader import gguf as gguf_loader
from minivllm.model_executor.loader import gguf_dequant, load_model
from minivllm.model_executor.loader.weight_cache import cache_path_for


def hf_from_gguf(path: str) -> LlamaForCausalLM:
    """The HF model as transformers' own GGUF loader builds it (its reverse permute).

    ``from_pretrained(gguf_file=...)`` needs accelerate, which is not installed, so
    this calls the same `load_gguf_checkpoint` it uses.
    """
    cfg = LlamaConfig(**load_gguf_checkpoint(path, return_tensors=False)["config"])
    model = LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}
    model.load_state_dict(state, strict=not cfg.tie_word_embeddings)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path / "cache"))


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def tiny_gguf(request, tmp_path):
    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(path, tie=request.param)
    return path


def test_weights_equal_transformers_gguf_loader(tiny_gguf):
    ours = gguf_loader.load_gguf_weights(tiny_gguf, use_cache=False)
    ref = hf_from_gguf(tiny_gguf).state_dict()
    assert set(ours) <= set(ref)
    for name, tensor in ours.items():
        assert torch.equal(tensor.float(), ref[name].float()), name


def test_logits_match_hf_model_loaded_from_gguf(tiny_gguf):
    hf = hf_from_gguf(tiny_gguf)
    ours = load_model(tiny_gguf, hf.config, torch.float32)
    ids = [5, 9, 100, 3, 7, 42, 1, 0, 64, 127, 8]
    runner = PagedRunner(ours, block_size=4)
    got = torch.cat([runner.step([("a", ids[:8])])] + [runner.step([("a", [t])]) for t in ids[8:]])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_second_load_reads_cache_without_dequantizing(tiny_gguf, monkeypatch):
    first = gguf_loader.load_gguf_weights(tiny_gguf)
    assert cache_path_for(tiny_gguf).exists()
    assert not list(cache_path_for(tiny_gguf).parent.glob("*.tmp"))

    def forbidden(*args, **kwargs):
        raise AssertionError("the cached load must not dequantize")

    monkeypatch.setattr(gguf_dequant, "dequantize", forbidden)
    monkeypatch.setattr(gguf, "GGUFReader", forbidden)
    second = gguf_loader.load_gguf_weights(tiny_gguf)
    assert second.keys() == first.keys()
    for name in first:
        assert second[name].dtype == first[name].dtype
        assert torch.equal(second[name], first[name]), name


def test_changed_file_misses_cache(tiny_gguf):
    before = cache_path_for(tiny_gguf)
    gguf_loader.load_gguf_weights(tiny_gguf)
    st = os.stat(tiny_gguf)
    os.utime(tiny_gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache_path_for(tiny_gguf) != before


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_fast_dequant_bit_identical_to_gguf(qtype):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(64, 4 * type_size), dtype=np.uint8)
    # Put finite float16 scales (and the Q4_1 minimum) where the block headers are.
    blocks = raw.reshape(-1, type_size)
    n_halfs = 2 if qtype == QT.Q4_1 else 1
    halfs = rng.normal(size=(blocks.shape[0], n_halfs)).astype(np.float16)
    blocks[:, : 2 * n_halfs] = halfs.view(np.uint8)
    got = gguf_dequant.dequantize(raw, qtype, (64, 4 * block_size))
    ref = gguf.quants.dequantize(raw, qtype)
    assert torch.equal(got, torch.from_numpy(ref))


def test_unknown_tensor_name_is_an_error():
    assert gguf_loader.gguf_to_hf_name("blk.3.ffn_up.weight") == "model.layers.3.mlp.up_proj.weight"
    assert gguf_loader.gguf_to_hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="no counterpart"):
        gguf_loader.gguf_to_hf_name("blk.0.ffn_gate_exps.weight")


def test_tensor_bytes_match_gguf_reader(tmp_path) -> None:  # noqa: ANN001
    """minivllm's header parser finds each tensor's bytes where gguf's reader does
    (it replaces GGUFReader, which parses every metadata array: seconds per load)."""
    from model_helpers import write_gguf

    from minivllm.model_executor.loader.gguf import _read_tensors

    for dtype in (np.float16, np.float32):
        path = write_gguf(tmp_path / f"{np.dtype(dtype).name}.gguf", "llama", dtype=dtype)
        ours = _read_tensors(path)[1]
        theirs = gguf.GGUFReader(str(path)).tensors
        assert [t.name for t in ours] == [t.name for t in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert a.tensor_type == b.tensor_type
            assert np.ascontiguousarray(a.data).tobytes() == np.ascontiguousarray(b.data).tobytes()
