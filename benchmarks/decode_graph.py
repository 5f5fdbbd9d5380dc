"""The CPU decode graph against the piecewise forward, in one engine, side by side.

Builds one -O2 engine on the default model (or ``--model``), then decodes the same
requests with the decode graph on and off (``CpuDecodeGraph.ready``), taking turns
``--rounds`` times, at each ``--batch`` size; prints the median output tokens/s of
each, their ratio, and how many requests gave identical greedy tokens.

``--lora N``: a LoRA engine (``max_loras`` N) with N random adapters (rank 16, every
projection), the requests spread over them round-robin; with
``MINIVLLM_CPU_FUSED_LAYERS=0`` the graph runs the LoRA layers as torch ops instead
of inside the fused C++ layers.

    python benchmarks/decode_graph.py --quantization gguf
    python benchmarks/decode_graph.py --quantization none --batch 1 8 32
    python benchmarks/decode_graph.py --lora 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def lora_adapters(llm: Any, count: int) -> list[Any]:
    """``count`` random adapters of ``llm``'s model, written to a temporary folder."""
    if not count:
        return []
    from minivllm.lora.request import LoRARequest

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from lora_helpers import write_random_adapter

    hf_config = llm.llm_engine.vllm_config.model_config.hf_text_config
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    tmp = Path(tempfile.mkdtemp(prefix="minivllm-graph-lora-"))
    return [
        LoRARequest(f"a{i}", i + 1, str(write_random_adapter(
            tmp / f"a{i}", hf_config, r=16, target_modules=modules, seed=i)))
        for i in range(count)
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    ap.add_argument("--quantization", default="gguf", choices=["gguf", "none"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--lora", type=int, default=0, help="adapters (0: LoRA off)")
    args = ap.parse_args()

    from minivllm import LLM, SamplingParams

    kwargs: dict[str, Any] = dict(quantization=args.quantization, max_model_len=1024)
    if args.model:
        kwargs["model"] = args.model
    if args.lora:
        kwargs.update(enable_lora=True, max_loras=args.lora, max_lora_rank=16)
    llm = LLM(**kwargs)
    graph = llm.llm_engine.executor.worker.model_runner.forward_runner.decode_graph
    if graph is None:
        raise SystemExit("this engine has no CPU decode graph (not -O2 on CPU?)")
    vocab = 1000
    adapters = lora_adapters(llm, args.lora)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    print(f"{'batch':>5} {'graph tok/s':>12} {'piecewise':>10} {'ratio':>6} {'same tokens':>12}")
    for batch in args.batch:
        prompts = [
            {"prompt_token_ids": [(17 * i + 31 * j) % vocab + 10 for j in range(args.prompt_len)]}
            for i in range(batch)
        ]
        loras = [adapters[i % len(adapters)] for i in range(batch)] if adapters else None
        speed: dict[bool, list[float]] = {True: [], False: []}
        tokens: dict[bool, list[list[int]]] = {}
        for _ in range(args.rounds):
            for on in (True, False):
                graph.ready = on
                start = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
                speed[on].append(batch * args.tokens / (time.perf_counter() - start))
                tokens[on] = [list(o.outputs[0].token_ids) for o in outs]
        graph.ready = True
        on, off = statistics.median(speed[True]), statistics.median(speed[False])
        same = sum(a == b for a, b in zip(tokens[True], tokens[False], strict=True))
        print(f"{batch:>5} {on:>12.1f} {off:>10.1f} {on / off:>6.2f} {same:>6}/{batch}")


if __name__ == "__main__":
    main()
