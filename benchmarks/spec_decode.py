"""Speculative decoding with prompt lookup (ngram) against plain decoding, side by side.

Workload: input-grounded requests, where the answer repeats much of the prompt
(rewrite a paragraph, edit code, summarise with quotes), greedy, through the
model's chat template.  Every engine lives in this one process and the rounds
interleave them, so the ratios compare runs under the same machine load.

1. Single stream: each request runs alone; decode tok/s is (output tokens - 1) /
   (last token time - first token time), the speed a user feels after the first
   token.  The ngram engine's acceptance rate (accepted / drafted tokens) and mean
   acceptance length (tokens per verification step) are printed next to it, and the
   outputs are checked to be identical.
2. Batch: ``--batch`` requests at once; output tok/s over the whole batch, for plain
   decoding, ngram always on, and ngram with ``disable_by_batch_size`` (speculation
   off at that batch size, as vLLM does for large, compute-bound batches).

    python benchmarks/spec_decode.py                 # default model, -O0, k=4, batch 32
    python benchmarks/spec_decode.py -k 3 --lookup 1 3 --rounds 1 --max-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from minivllm import LLM, SamplingParams

TEXT = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Its keeper, "
    "a quiet man named Elias, climbed the spiral stairs every evening to light the lamp. "
    "Ships passing in the night relied on its steady beam to avoid the rocks below. When "
    "the town decided to replace the lighthouse with an automatic beacon, Elias wrote a "
    "letter to the council asking them to keep the old tower as a museum."
)
CODE = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        price = item["price"]
        quantity = item["quantity"]
        total = total + price * quantity
    total = total + total * tax_rate
    return total


def cheapest_item(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
"""
TASKS = [
    f"Repeat the following paragraph exactly, but in the past perfect tense:\n\n{TEXT}",
    f"Rename the variable `total` to `amount` in this code and return the full code:\n\n{CODE}",
    f"Copy this paragraph and fix nothing, just repeat it word for word:\n\n{TEXT}",
    f"Add a docstring to each function and return the whole file:\n\n{CODE}",
]


def build_prompts(llm: LLM) -> list[dict[str, Any]]:
    from minivllm.tokenizer import apply_chat_template

    tokenizer = llm.get_tokenizer()
    prompts = []
    for task in TASKS:
        ids = apply_chat_template(tokenizer, [{"role": "user", "content": task}], tokenize=True)
        prompts.append({"prompt_token_ids": ids})
    return prompts


def single_stream(
    llm: LLM, prompt: dict[str, Any], params: SamplingParams
) -> tuple[float, list[int]]:
    """Decode tok/s of one request alone, and its tokens."""
    engine = llm.llm_engine
    rid = engine.add_request(None, prompt, params)
    first = last = None
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid and out.outputs[0].token_ids:
                now = time.perf_counter()
                first = first or now
                last = now
                tokens = list(out.outputs[0].token_ids)
    assert first is not None and last is not None
    return (len(tokens) - 1) / max(last - first, 1e-9), tokens


def batch_speed(llm: LLM, prompts: list[dict[str, Any]], params: SamplingParams) -> float:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def spec_counts(llm: LLM) -> tuple[int, int, int]:
    spec = llm.llm_engine.get_stats().spec_decoding_stats
    assert spec is not None
    return spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("-O", "--optimization-level", type=int, default=0)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--lookup", type=int, nargs=2, default=[2, 4], metavar=("MIN", "MAX"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    parser.add_argument("--disable-by-batch-size", type=int, default=8)
    args = parser.parse_args()

    common: dict[str, Any] = dict(
        model=args.model,
        optimization_level=args.optimization_level,
        max_model_len=1024,
        max_num_seqs=max(args.batch, 8),
        # Three engines share the machine: enough KV for the batch, not the default 1 GiB.
        kv_cache_memory_bytes=512 * 2**20,
    )
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": args.lookup[0],
        "prompt_lookup_max": args.lookup[1],
    }
    engines = {
        "plain": LLM(**common),
        "ngram": LLM(speculative_config=spec, **common),
        "ngram+disable": LLM(
            speculative_config={**spec, "disable_by_batch_size": args.disable_by_batch_size},
            **common,
        ),
    }
    prompts = build_prompts(engines["plain"])
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    speeds: dict[str, list[float]] = {"plain": [], "ngram": []}
    outputs: dict[str, list[list[int]]] = {"plain": [], "ngram": []}
    before = spec_counts(engines["ngram"])
    for r in range(args.rounds):
        for prompt in prompts:
            order = ["plain", "ngram"] if r % 2 == 0 else ["ngram", "plain"]
            for name in order:
                speed, tokens = single_stream(engines[name], prompt, greedy)
                speeds[name].append(speed)
                if r == 0:
                    outputs[name].append(tokens)
    after = spec_counts(engines["ngram"])
    drafts, drafted, accepted = (a - b for a, b in zip(after, before, strict=True))
    plain, ngram = statistics.median(speeds["plain"]), statistics.median(speeds["ngram"])
    print(f"\nSingle stream ({len(prompts)} input-grounded prompts x {args.rounds} rounds, "
          f"{args.max_tokens} max tokens, greedy, -O{args.optimization_level}):")  # fmt: skip
    print(f"  plain decode      {plain:8.1f} tok/s (median)")
    print(f"  ngram k={args.num_speculative_tokens} lookup {args.lookup[0]}..{args.lookup[1]} "
          f"{ngram:8.1f} tok/s (median)   speed-up {ngram / plain:.2f}x")  # fmt: skip
    print(f"  acceptance rate   {accepted / max(drafted, 1):.1%} ({accepted}/{drafted} draft "
          f"tokens), mean acceptance length {1 + accepted / max(drafts, 1):.2f}")  # fmt: skip
    same = outputs["plain"] == outputs["ngram"]
    print(f"  identical outputs {'yes' if same else 'NO'}")

    batch_prompts = [prompts[i % len(prompts)] for i in range(args.batch)]
    batch_params = SamplingParams(temperature=0.0, max_tokens=args.batch_max_tokens)
    batch: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        names = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in names:
            batch[name].append(batch_speed(engines[name], batch_prompts, batch_params))
    base = statistics.median(batch["plain"])
    print(f"\nBatch of {args.batch} ({args.batch_max_tokens} max tokens each), output tok/s:")
    for name, values in batch.items():
        value = statistics.median(values)
        label = name if name != "ngram+disable" else (
            f"ngram, disable_by_batch_size={args.disable_by_batch_size}"
        )  # fmt: skip
        print(f"  {label:40s} {value:8.1f} tok/s   {value / base:.2f}x of plain")


if __name__ == "__main__":
    main()
