"""Offline throughput: minivllm against HF transformers' batched ``generate``.

Both run the same model, dtype and requests in one process.  Requests are random
token ids with per-request input and output lengths and EOS ignored, so both sides
produce exactly the asked-for tokens.  Throughput counts only those requested
tokens (sum of output lengths / wall time), plus (input + output) tokens / s.

HF runs static batches of 16 requests in order, left-padded; a batch generates
until its longest request is done (``min_new_tokens = max_new_tokens``), so its
shorter requests waste work -- the cost continuous batching avoids.

Workloads:
  a: 48 requests, input length uniform in [32, 256], output uniform in [16, 256]
  b: vLLM's ``random`` dataset shape, 64 requests x 128 in / 128 out

    python benchmarks/throughput.py --workload all
    python benchmarks/throughput.py --workload a --num-requests 4 --skip-hf
"""

from __future__ import annotations

# isort: off
# minivllm first: it sets how long idle OpenMP threads spin before torch loads libgomp.
import minivllm  # noqa: F401
# isort: on

import gc
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minivllm.args.engine_args import EngineArgs
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import RequestOutputKind, SamplingParams

HF_BATCH_SIZE = 16
"""Requests per static HF batch."""


@dataclass
class Workload:
    """How many requests and the range of their input / output lengths."""

    name: str
    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]


WORKLOADS = {
    "a": Workload("a", 48, (32, 256), (16, 256)),
    "b": Workload("b", 64, (128, 128), (128, 128)),
}


@dataclass
class Result:
    """One engine's run of one workload."""

    engine: str
    seconds: float
    num_requests: int
    input_tokens: int
    output_tokens: int

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tps(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.seconds


def make_requests(
    w: Workload, num: int, seed: int, vocab: int, special: set[int]
) -> list[tuple[list[int], int]]:
    """``(prompt token ids, output length)`` per request, the same for every engine."""
    rng = random.Random(seed)
    allowed = [t for t in range(vocab) if t not in special]
    requests = []
    for _ in range(num):
        n_in = rng.randint(*w.input_len)
        n_out = rng.randint(*w.output_len)
        requests.append(([rng.choice(allowed) for _ in range(n_in)], n_out))
    return requests


def run_minivllm(engine: LLMEngine, requests: list[tuple[list[int], int]]) -> Result:
    """All requests at once, each with its own max_tokens; the scheduler batches them."""
    start = time.perf_counter()
    for i, (ids, n_out) in enumerate(requests):
        params = SamplingParams(
            temperature=0.0,
            max_tokens=n_out,
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        engine.add_request(f"bench-{i}", {"prompt_token_ids": ids}, params)
    produced = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                produced += len(out.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    wanted = sum(n for _, n in requests)
    assert produced == wanted, f"minivllm made {produced} tokens, {wanted} were asked for"
    return Result("minivllm", seconds, len(requests), sum(len(i) for i, _ in requests), wanted)


def load_hf(model_path: str, dtype: torch.dtype) -> torch.nn.Module:
    """The same model through transformers (a GGUF file is dequantized on load)."""
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.eval()


def run_hf(model: torch.nn.Module, requests: list[tuple[list[int], int]], pad_id: int) -> Result:
    """Static batches in request order, left-padded, each run to its longest output."""
    start = time.perf_counter()
    for first in range(0, len(requests), HF_BATCH_SIZE):
        batch = requests[first : first + HF_BATCH_SIZE]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        n_new = max(n for _, n in batch)
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                pad_token_id=pad_id,
            )
    seconds = time.perf_counter() - start
    wanted = sum(n for _, n in requests)
    return Result("transformers", seconds, len(requests), sum(len(i) for i, _ in requests), wanted)


def print_table(rows: list[tuple[str, Result]], ratios: dict[str, float]) -> None:
    header = (
        "workload",
        "engine",
        "requests",
        "in tok",
        "out tok",
        "time s",
        "out tok/s",
        "total tok/s",
    )
    lines = [header]
    for name, r in rows:
        lines.append(
            (
                name, r.engine, str(r.num_requests), str(r.input_tokens), str(r.output_tokens),
                f"{r.seconds:.2f}", f"{r.output_tps:.1f}", f"{r.total_tps:.1f}",
            )
        )  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print(
            "  ".join(
                c.rjust(w) if i > 1 else c.ljust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    for name, ratio in ratios.items():
        print(f"workload {name}: minivllm / transformers output throughput = {ratio:.2f}x")


def main() -> None:
    parser = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["a", "b", "all"], default="all")
    parser.add_argument(
        "--num-requests", type=int, default=None, help="Override the workload's request count."
    )
    parser.add_argument("--skip-hf", action="store_true", help="Run minivllm only.")
    EngineArgs.add_cli_args(parser)  # --dtype, --max-num-seqs, --max-num-batched-tokens, ...
    # --seed is the engine's flag; it also seeds the random requests.
    parser.set_defaults(dtype="float32")
    args = parser.parse_args()
    if args.num_requests is not None and args.num_requests < 1:
        parser.error("--num-requests must be >= 1")

    engine_args = EngineArgs.from_cli_args(args)
    engine = LLMEngine.from_engine_args(engine_args)
    model_config = engine.model_config
    tokenizer = engine.get_tokenizer()
    special = set(tokenizer.all_special_ids)
    torch_dtype = (
        model_config.dtype
        if isinstance(model_config.dtype, torch.dtype)
        else getattr(torch, str(args.dtype))
    )
    names = ["a", "b"] if args.workload == "all" else [args.workload]
    workloads = {
        n: make_requests(
            WORKLOADS[n], args.num_requests or WORKLOADS[n].num_requests, args.seed,
            model_config.get_vocab_size(), special,
        )
        for n in names
    }  # fmt: skip
    warmup = [(list(range(100, 132)), 8)] * 2  # first steps compile / allocate; not timed

    rows: list[tuple[str, Result]] = []
    run_minivllm(engine, warmup)
    for n in names:
        rows.append((n, run_minivllm(engine, workloads[n])))
        print(f"minivllm {n}: {rows[-1][1].output_tps:.1f} output tok/s", flush=True)
    model_path = str(model_config.model)
    del engine
    gc.collect()

    ratios: dict[str, float] = {}
    if not args.skip_hf:
        print(f"loading {model_path} in transformers ({torch_dtype}) ...", flush=True)
        model = load_hf(model_path, torch_dtype)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        run_hf(model, warmup, pad_id)
        for n in names:
            hf = run_hf(model, workloads[n], pad_id)
            ours = next(r for w, r in rows if w == n)
            rows.append((n, hf))
            ratios[n] = ours.output_tps / hf.output_tps
            print(f"transformers {n}: {hf.output_tps:.1f} output tok/s", flush=True)
    rows.sort(key=lambda row: row[0])
    print()
    print_table(rows, ratios)


if __name__ == "__main__":
    main()
