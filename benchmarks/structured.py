"""Structured outputs: what JSON-schema constraints cost.

1. Decode speed at batch 32 with every request constrained by its own JSON schema
   vs the same batch unconstrained, side by side: rounds alternate between the two
   (so both see the same machine load) and the table shows each one's median.  Each
   request decodes exactly ``--tokens`` tokens (the schemas ask for long arrays, the
   free batch ignores EOS), and only the steps after the prefill are timed.
2. Time to compile a schema: cold (first time) and cached (the same schema again), for
   xgrammar and llguidance.
3. The per-step mask cost inside the constrained runs: filling the bitmask from the
   32 matchers, applying it to the logits, and advancing the matchers.

    python benchmarks/structured.py                  # default model, batch 32
    python benchmarks/structured.py --tokens 16 --rounds 1 --batch-size 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

SCHEMAS_FOR_COMPILE: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 99999},
                    "email": {"type": "string", "format": "email"},
                    "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}},
                },
                "required": ["id", "email", "roles"],
            },
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}},
        },
        "required": ["user", "score"],
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "qty": {"type": "integer", "minimum": 1, "maximum": 100},
                "status": {"enum": ["new", "paid", "shipped", "returned"]},
            },
            "required": ["sku", "qty", "status"],
        },
        "minItems": 1,
    },
]


def long_schema(i: int) -> dict[str, Any]:
    """An array of 64 integers, a different range per request (so 32 distinct grammars)."""
    return {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 900 + i},
        "minItems": 64,
        "maxItems": 64,
    }


class Timers:
    """Wraps functions to add up their wall time per name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.enabled = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed


def install_timers() -> Timers:
    import minivllm.sample.sampler as sampler
    import minivllm.worker.model_runner as runner
    from minivllm.structured_output.bitmask import GrammarBitmask

    timers = Timers()
    sampler.apply_grammar_bitmask = timers.wrap("apply mask", sampler.apply_grammar_bitmask)
    runner.accept_tokens = timers.wrap("advance matchers", runner.accept_tokens)
    GrammarBitmask.fill = timers.wrap("fill bitmask", GrammarBitmask.fill)  # type: ignore[method-assign]
    return timers


def decode_run(engine: Any, params: list[Any], prompt: str) -> tuple[float, int, int]:
    """(decode seconds, decode tokens, decode steps) of one batch, prefill excluded."""
    for i, p in enumerate(params):
        engine.add_request(f"r{time.perf_counter_ns()}-{i}", prompt, p)
    engine.step()  # the prefill (and the first token)
    steps = tokens = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        running = engine.scheduler.get_num_unfinished_requests()
        engine.step()
        steps += 1
        tokens += running
    return time.perf_counter() - start, tokens, steps


def compile_times(tokenizer: Any, vocab_size: int, eos: int) -> list[tuple[str, float, float]]:
    from minivllm.config.structured_outputs import StructuredOutputsConfig
    from minivllm.sampling_params import StructuredOutputsParams
    from minivllm.structured_output.manager import StructuredOutputManager

    rows = []
    for backend in ("xgrammar", "guidance"):
        manager = StructuredOutputManager(
            StructuredOutputsConfig(backend=backend), tokenizer, vocab_size, [eos]
        )
        start = time.perf_counter()
        manager.grammar_for(StructuredOutputsParams(regex="a"))  # builds the vocabulary
        rows.append((f"{backend}: vocabulary set-up (once)", time.perf_counter() - start, 0.0))
        for i, schema in enumerate(SCHEMAS_FOR_COMPILE):
            params = StructuredOutputsParams(json=schema)
            start = time.perf_counter()
            manager.grammar_for(params)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            manager.grammar_for(StructuredOutputsParams(json=dict(schema)))
            cached = time.perf_counter() - start
            rows.append((f"{backend}: schema {i}", cold, cached))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--optimization-level", "-O", type=int, default=0)
    args = parser.parse_args()

    from minivllm import LLM, SamplingParams
    from minivllm.sampling_params import StructuredOutputsParams

    timers = install_timers()
    llm = LLM(
        optimization_level=args.optimization_level,
        max_model_len=1024,
        num_gpu_blocks_override=args.batch_size * (args.tokens // 16 + 4) + 8,
        structured_outputs_config={"disable_any_whitespace": True},
    )
    engine = llm.llm_engine
    prompt = "List some numbers as a JSON array:"
    n = args.batch_size
    constrained = [
        SamplingParams(
            temperature=0.8, seed=i, max_tokens=args.tokens,
            structured_outputs=StructuredOutputsParams(json=long_schema(i)),
        )
        for i in range(n)
    ]  # fmt: skip
    free = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=args.tokens, ignore_eos=True)
        for i in range(n)
    ]
    decode_run(engine, free[:2], prompt)  # warm-up (and compile the grammars once)
    decode_run(engine, constrained, prompt)
    speeds: dict[str, list[float]] = {"unconstrained": [], "JSON schema": []}
    step_ms: dict[str, list[float]] = {"unconstrained": [], "JSON schema": []}
    total_steps = 0
    for r in range(args.rounds):
        order = [("unconstrained", free), ("JSON schema", constrained)]
        for name, params in order if r % 2 == 0 else order[::-1]:
            timers.enabled = name == "JSON schema"
            seconds, tokens, steps = decode_run(engine, params, prompt)
            timers.enabled = False
            speeds[name].append(tokens / seconds)
            step_ms[name].append(1000 * seconds / steps)
            if name == "JSON schema":
                total_steps += steps

    print(f"\nDecode at batch {n}, {args.tokens} tokens per request, median of {args.rounds}")
    print("(a shared machine: compare the two rows, measured in the same run)\n")
    base = statistics.median(speeds["unconstrained"])
    print(f"{'':16} {'tok/s':>9} {'ms/step':>9} {'ratio':>7}")
    for name in speeds:
        tps = statistics.median(speeds[name])
        ms = statistics.median(step_ms[name])
        print(f"{name:16} {tps:9.1f} {ms:9.2f} {tps / base:7.2f}x")

    print(f"\nPer-step mask cost at batch {n} (mean over {total_steps} constrained steps)\n")
    for name in ("fill bitmask", "apply mask", "advance matchers"):
        mean_ms = 1000 * timers.seconds[name] / max(total_steps, 1)
        print(f"{name:18} {mean_ms:8.3f} ms")

    print("\nSchema compile time (ms)\n")
    tokenizer = engine.get_tokenizer()
    vocab = engine.model_config.get_vocab_size()
    print(f"{'':36} {'cold':>9} {'cached':>9}")
    for label, cold, cached in compile_times(tokenizer, vocab, tokenizer.eos_token_id):
        cached_text = f"{1000 * cached:9.3f}" if cached else f"{'':9}"
        print(f"{label:36} {1000 * cold:9.2f} {cached_text}")


if __name__ == "__main__":
    main()
