"""Soak test: one `minivllm serve` under a steady mixed load for N minutes.

Starts the server (default model, tool calling on) on a free loopback port and,
for ``--minutes`` (default 10), keeps ``--concurrency`` requests in flight: plain,
structured (JSON schema, regex, choice) and named-tool requests, streaming and
not, with one in ten hostile (malformed JSON, out-of-range values, huge or deep
schemas, a bad regex, an unknown model, a client that disconnects mid-stream,
NaN-like temperatures).  Every 10 s it samples the server's resident memory.

Prints the answers by status code, the number of 5xx (must be 0), the resident
memory after warm-up and at the end with their ratio, and the p50/p95 latency of
the well-formed requests.  Exits 1 on any 5xx, a request that raised, or a server
that died.  Everything stays on 127.0.0.1.

    python benchmarks/soak.py --minutes 1
    python benchmarks/soak.py --minutes 10 --concurrency 8 --serve-args=-O0
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx

HOST = "127.0.0.1"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
MESSAGES = [{"role": "user", "content": "Give me a short answer about Paris."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return total


# -- requests: each returns (kind, method, path, body or raw bytes, stream, hostile) --------
def well_formed(rng: random.Random, model: str) -> tuple[str, str, dict[str, Any]]:
    stream = rng.random() < 0.5
    base = {"model": model, "max_tokens": rng.randint(4, 24), "stream": stream,
            "temperature": rng.choice([0.0, 0.7])}  # fmt: skip
    chat = {**base, "messages": MESSAGES}
    choice = rng.randrange(6)
    if choice == 0:
        return "plain_completion", "/v1/completions", {**base, "prompt": "The capital of"}
    if choice == 1:
        return "plain_chat", "/v1/chat/completions", chat
    if choice == 2:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        return "json_schema", "/v1/chat/completions", {**chat, "response_format": fmt}
    if choice == 3:
        so = {"regex": "[A-Z][a-z]{2,8}( [a-z]{2,8}){0,3}"}
        return "regex", "/v1/completions", {**base, "prompt": "Name:", "structured_outputs": so}
    if choice == 4:
        return "choice", "/v1/chat/completions", {**chat, "guided_choice": ["yes", "no", "maybe"]}
    named = {"type": "function", "function": {"name": "get_weather"}}
    return "tool_named", "/v1/chat/completions", {**chat, "tools": [TOOL], "tool_choice": named}


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def hostile(rng: random.Random, model: str) -> tuple[str, str, Any]:
    """A request the server must answer with a 4xx (or serve), never a 5xx; raw bytes
    are sent as they are."""
    chat = {"model": model, "messages": MESSAGES, "max_tokens": 8}
    kinds = [
        ("malformed_json", "/v1/chat/completions", b'{"model": "x", "messages": [{"role": '),
        ("out_of_range", "/v1/completions",
         {"model": model, "prompt": "x", "max_tokens": -3, "top_p": 7, "n": 0}),
        ("huge_schema", "/v1/chat/completions", {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "h", "schema": {
                "type": "object",
                "properties": {f"f{i}": {"type": "integer"} for i in range(3000)}}}}}),
        ("deep_schema", "/v1/chat/completions",
         {**chat, "structured_outputs": {"json": deep_schema(rng.choice([64, 400]))}}),
        ("bad_regex", "/v1/completions",
         {"model": model, "prompt": "x", "max_tokens": 4, "guided_regex": "([a-z"}),
        ("unknown_model", "/v1/chat/completions", {**chat, "model": "no-such-model"}),
        ("disconnect", "/v1/chat/completions", {**chat, "max_tokens": 64, "stream": True}),
        ("nan_temperature", "/v1/chat/completions",
         json.dumps({**chat, "temperature": float("nan")}).encode()),
        ("inf_temperature", "/v1/completions",
         b'{"model": "%s", "prompt": "x", "temperature": 1e999}' % model.encode()),
        ("string_temperature", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        ("unknown_tool", "/v1/chat/completions", {**chat, "tools": [TOOL], "tool_choice": {
            "type": "function", "function": {"name": "missing"}}}),
    ]  # fmt: skip
    return kinds[rng.randrange(len(kinds))]


class Soak:
    """The load loop and its records."""

    def __init__(self, url: str, model: str, seed: int) -> None:
        self.url = url
        self.model = model
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.by_kind: collections.Counter[tuple[str, int]] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []
        self.client = httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0), trust_env=False)

    def next_request(self) -> tuple[str, str, Any, bool]:
        with self.lock:
            if self.rng.random() < 0.1:
                return (*hostile(self.rng, self.model), True)
            return (*well_formed(self.rng, self.model), False)

    def one(self) -> None:
        kind, path, body, is_hostile = self.next_request()
        start = time.perf_counter()
        try:
            status = self._send(kind, path, body)
        except Exception as exc:  # a transport failure is a finding, not a crash
            with self.lock:
                self.errors[f"{kind}: {type(exc).__name__}: {str(exc)[:80]}"] += 1
            return
        elapsed = time.perf_counter() - start
        with self.lock:
            self.statuses[status] += 1
            self.by_kind[(kind, status)] += 1
            if not is_hostile and status == 200:
                self.latencies.append(elapsed)

    def _send(self, kind: str, path: str, body: Any) -> int:
        url = self.url + path
        if isinstance(body, bytes):
            headers = {"Content-Type": "application/json"}
            return self.client.post(url, content=body, headers=headers).status_code
        if not body.get("stream"):
            return self.client.post(url, json=body).status_code
        with self.client.stream("POST", url, json=body) as resp:
            for i, _ in enumerate(resp.iter_lines()):
                if kind == "disconnect" and i >= 2:
                    break  # leaving the block closes the connection mid-stream
            return resp.status_code


def start_server(port: int, serve_args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", "--host", HOST,
               "--port", str(port), "--enable-auto-tool-choice", "--tool-call-parser",
               "hermes", *serve_args]  # fmt: skip
    log = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
            )
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"the server was not ready after {timeout:.0f} s; log: {log_path}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run(args: argparse.Namespace) -> int:
    port = free_port()
    url = f"http://{HOST}:{port}"
    log_path = Path(args.server_log)
    proc = start_server(port, shlex.split(args.serve_args), log_path)
    try:
        wait_ready(proc, url, args.ready_timeout, log_path)
        model = httpx.get(url + "/v1/models", trust_env=False).json()["data"][0]["id"]
        print(f"server ready on {url} (pid {proc.pid}, model {model}); soaking "
              f"{args.minutes} min at concurrency {args.concurrency}", flush=True)  # fmt: skip
        soak = Soak(url, model, args.seed)
        samples = _load(soak, proc, args)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return _report(soak, samples, args, proc.returncode)


def _load(
    soak: Soak, proc: subprocess.Popen[bytes], args: argparse.Namespace
) -> list[tuple[float, int]]:
    """Keep ``concurrency`` requests in flight until the time is up; RSS samples."""
    start = time.monotonic()
    end = start + args.minutes * 60
    samples: list[tuple[float, int]] = [(0.0, rss_bytes(proc.pid))]
    next_sample = start + args.sample_s
    with ThreadPoolExecutor(args.concurrency) as pool:
        pending: set[Future[None]] = set()
        while time.monotonic() < end and proc.poll() is None:
            while len(pending) < args.concurrency:
                pending.add(pool.submit(soak.one))
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            now = time.monotonic()
            if now >= next_sample:
                samples.append((now - start, rss_bytes(proc.pid)))
                print(f"  {now - start:6.0f} s  RSS {samples[-1][1] / 2**20:7.1f} MiB  "
                      f"answers {sum(soak.statuses.values())}", flush=True)  # fmt: skip
                next_sample += args.sample_s
        wait(pending, timeout=600)
    samples.append((time.monotonic() - start, rss_bytes(proc.pid)))
    return samples


def _report(soak: Soak, samples: list[tuple[float, int]], args: argparse.Namespace,
            exit_code: int | None) -> int:  # fmt: skip
    warm_at = min(args.warmup_s, args.minutes * 60 / 2)
    warm = next((rss for t, rss in samples if t >= warm_at), samples[-1][1])
    final = samples[-1][1]
    num_5xx = sum(n for status, n in soak.statuses.items() if status >= 500)
    print("\nanswers by status:", dict(sorted(soak.statuses.items())))
    print("by kind and status:")
    for (kind, status), n in sorted(soak.by_kind.items()):
        print(f"  {kind:20s} {status}  {n}")
    if soak.errors:
        print("requests that raised:", dict(soak.errors))
    print(f"5xx answers: {num_5xx} (must be 0)")
    print(f"server RSS: warm-up ({warm_at:.0f} s) {warm / 2**20:.1f} MiB, "
          f"final {final / 2**20:.1f} MiB, final/warm-up {final / warm:.3f}")  # fmt: skip
    lat = soak.latencies
    print(f"well-formed 200s: {len(lat)}; latency p50 {percentile(lat, 50):.2f} s, "
          f"p95 {percentile(lat, 95):.2f} s")  # fmt: skip
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({
            "statuses": soak.statuses, "num_5xx": num_5xx, "errors": soak.errors,
            "rss_samples": samples, "rss_warm": warm, "rss_final": final,
            "rss_ratio": final / warm, "p50_s": percentile(lat, 50),
            "p95_s": percentile(lat, 95), "num_well_formed_200": len(lat),
        }, indent=1))  # fmt: skip
    died = exit_code not in (0, -15, None) and samples[-1][0] < args.minutes * 60 - 5
    return 1 if num_5xx or soak.errors or died else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="Soak length (default 10).")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="Requests in flight (default 8)."
    )
    parser.add_argument(
        "--serve-args",
        default="",
        help='Extra `minivllm serve` flags, as one string: --serve-args="-O0 --max-model-len 2048".',
    )
    parser.add_argument(
        "--sample-s", type=float, default=10.0, help="RSS sampling period (default 10 s)."
    )
    parser.add_argument("--warmup-s", type=float, default=60.0,
                        help="RSS baseline: the first sample after this many seconds, at most "
                        "half the run (default 60).")  # fmt: skip
    parser.add_argument(
        "--ready-timeout", type=float, default=900.0, help="Seconds to wait for /health."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the request mix (default 0).")
    parser.add_argument("--server-log", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "soak_server.log"),
                        help="Where the server's output goes.")  # fmt: skip
    parser.add_argument("--output-json", default=None, help="Write the figures to this file.")
    args = parser.parse_args()
    if args.minutes <= 0 or args.concurrency < 1 or args.sample_s <= 0:
        parser.error("--minutes and --sample-s must be > 0 and --concurrency >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
