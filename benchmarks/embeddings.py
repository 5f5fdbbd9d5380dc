"""Batched embedding throughput: minivllm against sentence-transformers' ``encode``.

One process, one model, the same torch threads: a random-weight BERT saved to a
temporary directory as a sentence-transformers checkpoint (CLS or MEAN pooling,
normalized), and 256 inputs of 32-256 tokens (uniform, fixed seed).  Each side
embeds every input once after a warm-up; the table gives inputs/s and tokens/s,
and the lowest cosine similarity between the two sides' embeddings (a check that
both computed the same thing).

sentence-transformers pads each batch (``--st-batch-size``, default its 32) after
sorting the inputs by length; minivllm packs the inputs without padding into
steps of ``max_num_batched_tokens`` tokens.

    python benchmarks/embeddings.py                         # all-MiniLM-L6-v2 shape
    python benchmarks/embeddings.py --shape bert-base -O0   # BERT-base shape, eager
"""

from __future__ import annotations

# isort: off
# minivllm first: it sets how long idle OpenMP threads spin before torch loads libgomp.
import minivllm  # noqa: F401
# isort: on

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers

SHAPES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}  # fmt: skip
"""Model shapes: all-MiniLM-L6-v2's (the most used embedding model) and BERT-base's."""
NUM_WORDS = 30000
"""Vocabulary: one WordPiece token per word, so an input of n words is n + 2 tokens."""


def save_model(path: Path, shape: str, pooling: str) -> None:
    """A random BERT of ``shape`` as a sentence-transformers checkpoint in ``path``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    hf_dir = path / "hf"
    hf_dir.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(NUM_WORDS))]
    tokenizer = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    tokenizer.save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **SHAPES[shape], vocab_size=len(vocab), max_position_embeddings=512
    )
    transformers.BertModel(config).eval().save_pretrained(hf_dir)
    body = Transformer(str(hf_dir))
    modules = [body, Pooling(body.get_embedding_dimension(), pooling), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(path / "st"))


def make_inputs(num: int, low: int, high: int, seed: int) -> list[str]:
    """``num`` texts of ``low``..``high`` tokens (two of them [CLS] and [SEP])."""
    rng = random.Random(seed)
    return [
        " ".join(f"w{rng.randrange(NUM_WORDS)}" for _ in range(rng.randint(low, high) - 2))
        for _ in range(num)
    ]


def run_minivllm(
    model: str, texts: list[str], args: argparse.Namespace
) -> tuple[float, torch.Tensor, str]:
    from minivllm import LLM

    llm = LLM(
        model,
        dtype=args.dtype,
        optimization_level=args.optimization_level,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=256,
    )
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    llm.embed(texts[:16], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.embed(texts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, torch.tensor([o.outputs.embedding for o in outs]), dtype


def run_sentence_transformers(
    model: str, texts: list[str], batch_size: int, dtype: str
) -> tuple[float, torch.Tensor]:
    from sentence_transformers import SentenceTransformer

    kwargs = {} if dtype == "float32" else {"model_kwargs": {"torch_dtype": getattr(torch, dtype)}}
    st = SentenceTransformer(model, device="cpu", **kwargs)
    st.encode(texts[:16], batch_size=batch_size)  # warm-up
    start = time.perf_counter()
    embeds = st.encode(texts, batch_size=batch_size, convert_to_tensor=True)
    return time.perf_counter() - start, embeds.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="minilm")
    parser.add_argument("--pooling", choices=["cls", "mean"], default="mean")
    parser.add_argument("--num-inputs", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("-O", "--optimization-level", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--st-batch-size", type=int, default=32)
    parser.add_argument(
        "--dtype", default="auto", help="minivllm's dtype (auto: bfloat16 where the CPU has it)"
    )
    parser.add_argument(
        "--st-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="sentence-transformers' dtype (float32: what encode runs unless told)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = make_inputs(args.num_inputs, args.min_len, args.max_len, args.seed)
    num_tokens = sum(len(t.split()) + 2 for t in texts)
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp), args.shape, args.pooling)
        model = str(Path(tmp) / "st")
        st_time, st_embeds = run_sentence_transformers(
            model, texts, args.st_batch_size, args.st_dtype
        )
        mv_time, mv_embeds, mv_dtype = run_minivllm(model, texts, args)
    torch.set_num_threads(args.threads)
    cosine = torch.nn.functional.cosine_similarity(mv_embeds, st_embeds).min().item()
    print(
        f"\n{args.num_inputs} inputs, {num_tokens} tokens ({args.min_len}-{args.max_len} each), "
        f"{args.shape} shape, {args.pooling} pooling, {args.threads} threads, "
        f"minivllm -O{args.optimization_level} {mv_dtype}, "
        f"sentence-transformers batch {args.st_batch_size} {args.st_dtype}"
    )
    print(f"{'':24}{'seconds':>10}{'inputs/s':>12}{'tokens/s':>12}{'speed-up':>10}")
    for name, secs in (("sentence-transformers", st_time), ("minivllm", mv_time)):
        rate = args.num_inputs / secs
        print(f"{name:24}{secs:10.2f}{rate:12.1f}{num_tokens / secs:12.0f}{st_time / secs:10.2f}x")
    print(f"lowest cosine(minivllm, sentence-transformers): {cosine:.6f}")


if __name__ == "__main__":
    main()
