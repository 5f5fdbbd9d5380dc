"""One KV block (every layer's keys and values) as checksummed bytes.

Format: ``MAGIC``, a 4-byte big-endian header length, a JSON header (key, layout id,
dtype, shape, payload size, SHA-256 of the payload), then the payload (the raw
tensor).  Decoding checks all of it: a truncated, corrupted or foreign block raises
`CorruptBlockError`, which the connectors treat as a miss; it is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import struct

import torch

MAGIC = b"MVKVBLK1"
_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 16


class CorruptBlockError(ValueError):
    """A stored or received block that must not be loaded."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_block(key: str, layout_id: str, block: torch.Tensor) -> bytes:
    """``block``: ``[layers, 2, block_size, heads, dim]`` on any device."""
    data = block.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    header = {
        "key": key,
        "layout": layout_id,
        "dtype": _dtype_name(block.dtype),
        "shape": list(block.shape),
        "nbytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LEN.pack(len(head)) + head + data


def decode_block(
    data: bytes, key: str, layout_id: str, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """The block stored in ``data``; `CorruptBlockError` unless everything checks out."""
    header = _read_header(data)
    start = len(MAGIC) + _LEN.size + header.pop("_head_len")
    payload = memoryview(data)[start:]
    expected = {"key": key, "layout": layout_id, "dtype": _dtype_name(dtype), "shape": list(shape)}
    for name, value in expected.items():
        if header.get(name) != value:
            raise CorruptBlockError(f"{name} {header.get(name)!r} is not {value!r}")
    if header.get("nbytes") != len(payload):
        raise CorruptBlockError(
            f"truncated: {len(payload)} payload bytes, the header says {header.get('nbytes')}"
        )
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CorruptBlockError("checksum mismatch")
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _read_header(data: bytes) -> dict:
    if len(data) < len(MAGIC) + _LEN.size or not data.startswith(MAGIC):
        raise CorruptBlockError("not a minivllm KV block (bad magic or too short)")
    (head_len,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if head_len > MAX_HEADER_BYTES or start + head_len > len(data):
        raise CorruptBlockError("truncated or oversized header")
    try:
        header = json.loads(data[start : start + head_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptBlockError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptBlockError("header is not an object")
    header["_head_len"] = head_len
    return header
