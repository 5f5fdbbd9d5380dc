#!/usr/bin/env bash
# A bounded soak run: start `minivllm serve` on 127.0.0.1, keep CONCURRENCY clients
# sending mixed requests (completions and chat, streamed or not, some hanging up
# mid-stream) for DURATION seconds, then print requests, failures, p50/p99 latency,
# the server's RSS growth, and check that it went back to idle (nothing running or
# waiting, KV cache empty).  Exit status 0 only if nothing failed and it went idle.
#
#   scripts/soak.sh [DURATION_S=180] [CONCURRENCY=16] [-- extra `minivllm serve` flags]
#
# The server runs -O0 unless the extra flags say otherwise; its log is kept in
# $TMPDIR/minivllm-soak-*.log.
set -euo pipefail

DURATION=${1:-180}
CONCURRENCY=${2:-16}
shift $(( $# > 2 ? 2 : $# ))
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")
[[ " ${EXTRA[*]-} " == *" -O"* ]] || EXTRA=(-O0 "${EXTRA[@]}")

PY=${PYTHON:-python}
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp "${TMPDIR:-/tmp}/minivllm-soak-XXXXXX.log")
"$PY" -m minivllm.entrypoints.cli serve --host 127.0.0.1 --port "$PORT" \
    --uvicorn-log-level warning "${EXTRA[@]}" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

echo "soak: server pid $SERVER on 127.0.0.1:$PORT (log $LOG); ${DURATION} s x ${CONCURRENCY} clients"
"$PY" - "$PORT" "$DURATION" "$CONCURRENCY" "$SERVER" <<'PYEOF'
import asyncio, json, random, statistics, sys, time

import httpx
import psutil

port, duration, concurrency, pid = (int(a) for a in sys.argv[1:5])
url = f"http://127.0.0.1:{port}"
server = psutil.Process(pid)

deadline = time.monotonic() + 300
while True:
    if not server.is_running() or server.status() == psutil.STATUS_ZOMBIE:
        sys.exit("soak: the server exited during start-up (see its log)")
    try:
        if httpx.get(f"{url}/health", timeout=1).status_code == 200:
            break
    except httpx.TransportError:
        pass
    if time.monotonic() > deadline:
        sys.exit("soak: the server was not ready in 300 s")
    time.sleep(0.5)


def rss_mib() -> float:
    return server.memory_info().rss / (1 << 20)


def metric(name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


latencies: list[float] = []
failures: list[str] = []
hangups = 0


def body(rng: random.Random) -> tuple[str, dict]:
    max_tokens = rng.choice([4, 16, 32, 64])
    common = {"max_tokens": max_tokens, "temperature": rng.choice([0, 0.7, 1.0]),
              "ignore_eos": True, "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/v1/completions", {"prompt": f"Soak {rng.random():.6f}: a story about", **common}
    messages = [{"role": "user", "content": f"Say something about the number {rng.randint(0, 999)}."}]
    return "/v1/chat/completions", {"messages": messages, **common}


async def one(client: httpx.AsyncClient, rng: random.Random) -> None:
    global hangups
    path, payload = body(rng)
    start = time.monotonic()
    if payload["stream"]:
        hang_up = rng.random() < 0.1
        tokens = 0
        async with client.stream("POST", path, json=payload) as resp:
            if resp.status_code != 200:
                failures.append(f"{resp.status_code} {(await resp.aread())[:200]!r}")
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    failures.append(f"stream error {event['error']}")
                    return
                tokens += sum(1 for c in event["choices"] if c.get("text") or c.get("delta", {}).get("content"))
                if hang_up and tokens >= 2:
                    hangups += 1
                    return
    else:
        resp = await client.post(path, json=payload)
        if resp.status_code != 200:
            failures.append(f"{resp.status_code} {resp.text[:200]}")
            return
        got = resp.json()["usage"]["completion_tokens"]
        if got != payload["max_tokens"]:
            failures.append(f"{got} tokens, asked {payload['max_tokens']} with ignore_eos")
            return
    latencies.append(time.monotonic() - start)


async def worker(i: int, stop_at: float) -> None:
    rng = random.Random(i)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while time.monotonic() < stop_at:
            try:
                await one(client, rng)
            except httpx.HTTPError as exc:
                failures.append(repr(exc))


rss_start = rss_mib()
start = time.monotonic()
async def _main() -> None:
    await asyncio.gather(*(worker(i, start + duration) for i in range(concurrency)))


asyncio.run(_main())
elapsed = time.monotonic() - start

idle = False
for _ in range(100):
    gauges = [metric(n) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                  "vllm:kv_cache_usage_perc")]
    if not any(gauges):
        idle = True
        break
    time.sleep(0.2)
healthy = httpx.get(f"{url}/health", timeout=5).status_code == 200

lat = sorted(latencies)
def pct(p: float) -> float:
    return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] if lat else float("nan")

total = len(latencies) + len(failures) + hangups
print(f"soak: {elapsed:.0f} s, {concurrency} clients: {total} requests, {len(latencies)} ok, "
      f"{hangups} hung up on purpose, {len(failures)} failures")
print(f"soak: latency p50 {pct(50):.2f} s, p99 {pct(99):.2f} s, max {lat[-1] if lat else float('nan'):.2f} s")
print(f"soak: server RSS {rss_start:.0f} -> {rss_mib():.0f} MiB ({rss_mib() - rss_start:+.0f} MiB)")
print(f"soak: after the run: {'idle' if idle else 'NOT idle'} (running/waiting/KV usage), "
      f"/health {'200' if healthy else 'not 200'}")
for failure in failures[:10]:
    print("  failure:", failure)
sys.exit(0 if not failures and idle and healthy else 1)
PYEOF
