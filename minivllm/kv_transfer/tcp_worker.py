"""`TcpConnector`, the worker half: the producer's send buffer and server, the
consumer's pulls.

Wire format (one connection per pull): the consumer sends a 4-byte big-endian
length and a JSON request ``{"request_id", "first_block", "num_blocks",
"digest", "layout"}``; the producer answers with a 4-byte length and a JSON
status ``{"ok": true}`` or ``{"ok": false, "error": ...}``, then, when ok, an
8-byte length and the blocks encoded as one checksummed `block_codec` block of
shape ``[layers, 2, num_blocks, block_size, heads, dim]``.  A short read (the
producer died), a checksum or layout mismatch, a refused or timed-out connection
all fail the load with a message naming the producer.
"""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minivllm.kv_transfer.base import KVLoad, KVSave
from minivllm.kv_transfer.block_codec import CorruptBlockError, decode_block, encode_block
from minivllm.kv_transfer.layout import KVLayout
from minivllm.kv_transfer.worker import KVConnectorWorker, LoadFailed
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.kv_transfer import KVTransferConfig

logger = init_logger(__name__)

_LEN4 = struct.Struct(">I")
_LEN8 = struct.Struct(">Q")
MAX_REQUEST_BYTES = 1 << 16


@dataclass
class Outgoing:
    """A finished prefill's KV, kept until a consumer pulls it (or it expires)."""

    digest: str
    blocks: torch.Tensor
    """``[layers, 2, num_blocks, block_size, heads, dim]`` on the CPU."""
    expires: float


def recv_exactly(sock: socket.socket, num_bytes: int) -> bytes:
    """``num_bytes`` bytes, or ConnectionError when the peer closes before."""
    chunks, got = [], 0
    while got < num_bytes:
        chunk = sock.recv(min(num_bytes - got, 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed after {got} of {num_bytes} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_json(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN4.pack(len(data)) + data)


def recv_json(sock: socket.socket) -> dict[str, Any]:
    (size,) = _LEN4.unpack(recv_exactly(sock, _LEN4.size))
    if size > MAX_REQUEST_BYTES:
        raise ConnectionError(f"message of {size} bytes is too long")
    return json.loads(recv_exactly(sock, size))


class TcpConnectorWorker(KVConnectorWorker):
    """Producer: keeps each finished prefill's KV and serves it.  Consumer: pulls it."""

    def __init__(self, layout: KVLayout, config: KVTransferConfig) -> None:
        super().__init__(layout)
        extra = config.kv_connector_extra_config
        self.timeout_s = float(extra.get("transfer_timeout_s", 30.0))
        self.ttl_s = float(extra.get("send_ttl_s", 480.0))
        self._outbox: dict[str, Outgoing] = {}
        self._outbox_lock = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None
        if config.is_kv_producer:
            self._serve(config.kv_ip, config.kv_port)

    # -- producer -----------------------------------------------------------------
    def _serve(self, host: str, port: int) -> None:
        worker = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                worker._answer(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        try:
            self._server = socketserver.ThreadingTCPServer((host, port), Handler)
        except OSError as exc:
            raise ValueError(
                f"TcpConnector producer cannot listen on {host}:{port} ({exc}); choose a free "
                "kv_port in --kv-transfer-config"
            ) from None
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="kv-send", daemon=True).start()
        logger.info("TcpConnector: serving prefilled KV on %s:%d", host, port)

    def save(self, save: KVSave) -> None:
        ids = torch.tensor(save.block_ids, dtype=torch.long, device=self.layers[0].device)
        blocks = torch.stack([kv.index_select(1, ids) for kv in self.layers]).cpu()
        with self._outbox_lock:
            now = time.monotonic()
            for rid in [r for r, o in self._outbox.items() if o.expires < now]:
                del self._outbox[rid]  # never pulled: the decode side gave up
            self._outbox[save.req_id] = Outgoing(save.digest, blocks, now + self.ttl_s)
        self.count_saved(len(save.block_ids), blocks.numel() * blocks.element_size())

    def _answer(self, sock: socket.socket) -> None:
        sock.settimeout(self.timeout_s)
        try:
            ask = recv_json(sock)
            with self._outbox_lock:
                out = self._outbox.get(str(ask.get("request_id")))
            error = self._check_ask(ask, out)
            if error is not None:
                send_json(sock, {"ok": False, "error": error})
                return
            assert out is not None
            first, count = int(ask["first_block"]), int(ask["num_blocks"])
            part = out.blocks[:, :, first : first + count]
            key = f"{ask['request_id']}:{first}:{count}"
            data = encode_block(key, self.layout.layout_id, part)
            send_json(sock, {"ok": True})
            sock.sendall(_LEN8.pack(len(data)) + data)
            with self._outbox_lock:
                self._outbox.pop(str(ask["request_id"]), None)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("TcpConnector: a KV pull failed: %s", exc)

    def _check_ask(self, ask: dict[str, Any], out: Outgoing | None) -> str | None:
        if out is None:
            return f"no KV for request {ask.get('request_id')!r} (never prefilled here, or expired)"
        if ask.get("layout") != self.layout.layout_id:
            return "the consumer runs another model or KV layout"
        if ask.get("digest") != out.digest:
            return "the prompt differs from the one prefilled here"
        first, count = int(ask.get("first_block", -1)), int(ask.get("num_blocks", -1))
        if first < 0 or count < 0 or first + count > out.blocks.shape[2]:
            return f"blocks {first}..{first + count} are out of range"
        return None

    # -- consumer -----------------------------------------------------------------
    def load(self, load: KVLoad) -> int:
        src = load.source
        where = f"{src.get('host')}:{src.get('port')}"
        try:
            part = self._pull(load, (str(src["host"]), int(src["port"])))
        except (OSError, ConnectionError, CorruptBlockError, ValueError) as exc:
            raise LoadFailed(
                f"KV transfer from the prefill instance {where} failed ({exc}); is it running?"
            ) from None
        ids = torch.tensor(load.block_ids, dtype=torch.long, device=self.layers[0].device)
        for kv, layer in zip(self.layers, part, strict=True):
            kv.index_copy_(1, ids, layer.to(kv.device))
        self.count_loaded(len(load.block_ids), part.numel() * part.element_size())
        return load.num_tokens

    def _pull(self, load: KVLoad, address: tuple[str, int]) -> torch.Tensor:
        src = load.source
        ask = {
            "request_id": src["request_id"],
            "first_block": src["first_block"],
            "num_blocks": src["num_blocks"],
            "digest": src["digest"],
            "layout": self.layout.layout_id,
        }
        with socket.create_connection(address, timeout=self.timeout_s) as sock:
            send_json(sock, ask)
            status = recv_json(sock)
            if not status.get("ok"):
                raise ValueError(f"the producer refused: {status.get('error')}")
            (size,) = _LEN8.unpack(recv_exactly(sock, _LEN8.size))
            data = recv_exactly(sock, size)
        _, _, bs, heads, dim = self.layers[0].shape
        shape = (len(self.layers), 2, len(load.block_ids), bs, heads, dim)
        key = f"{src['request_id']}:{src['first_block']}:{src['num_blocks']}"
        return decode_block(data, key, self.layout.layout_id, self.dtype, shape)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        super().shutdown()
