"""The fused C++ decoder layer for each family's layer form, against the layer's
own ops on one decode step (attention inlined as the decode graph runs it):
Qwen2's biases, Qwen3's q/k norms, and Gemma 3's sandwich-norm GeGLU layer (four
``1 + weight`` norms, q/k norms, tanh GELU, one stream), alone and as a stack
whose layers differ in sliding window, rotary table and KV cache group."""

from __future__ import annotations

import pytest
import torch
from fused_layer_helpers import StepHandle, set_q4, with_decode_attention
from transformers import Gemma3TextConfig, LlamaConfig

from minivllm.attention.forward_context import DecodeStep, ForwardContextHandle
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.fused_decoder_layer import (
    GELU_TANH,
    NORM_PLUS_ONE,
    QK_NORM,
    SANDWICH,
    SUM_OUTPUT,
    FusedDecoderLayer,
    FusedDecoderStack,
    RunByStack,
    fusable,
    fused_layers,
    layer_parts,
)
from minivllm.model_executor.layers.quantized_linear import INT8, Q4
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from minivllm.model_executor.models.gemma3 import Gemma3DecoderLayer
from minivllm.model_executor.models.llama import AttnOptions, LlamaDecoderLayer

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")

HIDDEN, INTER, NH, NKV, HD = 128, 192, 8, 2, 32
BLOCK, BLOCKS = 4, 64
KINDS = (Q4, INT8, Q4, INT8)


def _lowbit(layer: torch.nn.Module, gen: torch.Generator) -> None:
    """Low-bit projections (int4 and int8 mixed), random norms and biases."""
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    for linear, kind in zip(linears, KINDS, strict=True):
        bias = linear.bias
        if kind == Q4:
            set_q4(linear, gen)
        else:
            linear.weight.data = torch.randn(linear.weight.shape, generator=gen) * 0.05
            linear.quantize_int8()
        if bias is not None:
            bias.data = torch.randn(bias.shape, generator=gen) * 0.5
    for name, module in layer.named_modules():
        if name.endswith("norm"):
            module.weight.data = 0.5 + 0.5 * torch.rand(module.weight.shape, generator=gen)


def _llama_layer(opts: AttnOptions) -> LlamaDecoderLayer:
    config = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=NH,
        num_key_value_heads=NKV, head_dim=HD, num_hidden_layers=1, rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )  # fmt: skip
    rotary = RotaryEmbedding(HD, HD, 256, {"rope_theta": 10000.0})
    layer = LlamaDecoderLayer(config, rotary, opts, prefix="layers.0")
    _lowbit(layer, torch.Generator().manual_seed(1))
    return layer


def _gemma_config() -> Gemma3TextConfig:
    return Gemma3TextConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=NH,
        num_key_value_heads=NKV, head_dim=HD, num_hidden_layers=1, rms_norm_eps=1e-6,
        max_position_embeddings=256, query_pre_attn_scalar=HD, sliding_window=5,
    )  # fmt: skip


def _gemma_layer(window: int | None, theta: float, seed: int) -> Gemma3DecoderLayer:
    rotary = RotaryEmbedding(HD, HD, 256, {"rope_theta": theta})
    layer = Gemma3DecoderLayer(_gemma_config(), rotary, window, prefix=f"layers.{seed}")
    _lowbit(layer, torch.Generator().manual_seed(seed))
    return layer


def _cache(gen: torch.Generator) -> torch.Tensor:
    return torch.randn(2, BLOCKS, BLOCK, NKV, HD, generator=gen)


def _step(lens: list[int], groups: int, gen: torch.Generator) -> tuple[torch.Tensor, DecodeStep]:
    """Positions and a decode step of ``len(lens)`` requests over ``groups`` KV cache
    groups (each its own shuffled block table, as Gemma 3's groups have)."""
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    positions = seq_lens.long() - 1
    tables, slots = [], []
    width = 6  # request i owns blocks 1 + 6 i ... of a group
    for _ in range(groups):
        table = torch.stack(
            [torch.randperm(width, generator=gen) + 1 + width * i for i in range(len(lens))]
        ).to(torch.int32)
        slot = table.gather(1, (positions // BLOCK)[:, None]).squeeze(1).long() * BLOCK
        tables.append(table)
        slots.append(slot + positions % BLOCK)
    return positions, DecodeStep(seq_lens, tables, slots)


def _run_layer(layer, lens: list[int], fused: bool, residual: bool | None):
    """One decode step through ``layer``: ``residual`` None for a one-stream layer
    (Gemma 3), else whether a residual stream comes in."""
    gen = torch.Generator().manual_seed(3)
    layer.self_attn.attn.kv_cache = _cache(gen)
    hidden = torch.randn(len(lens), HIDDEN, generator=gen)
    args = [hidden]
    if residual is not None:
        args.append(torch.randn(len(lens), HIDDEN, generator=gen) if residual else None)
    positions, step = _step(lens, 1, gen)
    with StepHandle(step) as handle:
        if fused:
            assert fusable(layer, torch.float32)
            out = FusedDecoderLayer(layer, handle)(positions, *args)
        else:
            out = with_decode_attention(layer, handle)(positions, *args)
    outs = out if isinstance(out, tuple) else (out,)
    return (*outs, layer.self_attn.attn.kv_cache)


def _assert_close(got, want) -> None:
    """Equal up to float32 rounding, judged on the whole tensor: Gemma's output norms
    rescale values of ~2, so single elements differ by up to ~1e-4 while the
    error relative to the tensor stays near 1e-5 (a wrong step is ~1e-1).  Where a
    float rounding moves a GEMM input across an int8 code boundary of the second
    activation term the tensor moves by a few 1e-5 more (6.4e-5 for Qwen2's biases
    at batch 1 on the AVX-512 VNNI path), hence 1e-4."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert ((g - w).norm() / w.norm()).item() < 1e-4


LENS = [[1], [9, 22, 3], [5, 1, 17, 12, 24, 2, 8, 19, 11, 6]]


@pytest.mark.parametrize("lens", LENS, ids=["1", "3", "10"])
@pytest.mark.parametrize(
    "opts,form",
    [(AttnOptions(qkv_bias=True, o_bias=True), 0), (AttnOptions(qk_norm=True), QK_NORM)],
    ids=["qwen2-biases", "qwen3-qk-norm"],
)
def test_llama_form_families(opts: AttnOptions, form: int, lens: list[int]) -> None:
    layer = _llama_layer(opts)
    assert layer_parts(layer).form == form
    for residual in (False, True):
        _assert_close(
            _run_layer(layer, lens, True, residual), _run_layer(layer, lens, False, residual)
        )


@pytest.mark.parametrize("lens", LENS, ids=["1", "3", "10"])
@pytest.mark.parametrize("window", [None, 5], ids=["global", "local"])
def test_gemma3_layer(window: int | None, lens: list[int]) -> None:
    layer = _gemma_layer(window, 10000.0, 2)
    want_form = NORM_PLUS_ONE | SANDWICH | QK_NORM | GELU_TANH | SUM_OUTPUT
    assert layer_parts(layer).form == want_form
    got = _run_layer(layer, lens, True, None)
    assert len(got) == 2  # one stream and the cache, as the layer returns
    _assert_close(got, _run_layer(layer, lens, False, None))


def test_gemma3_stack_mixes_windows_rotary_tables_and_groups() -> None:
    """Gemma 3's pattern: local layers (window, rope base 10k, their KV cache group)
    and a global one (whole context, rope base 1M, another group) in one
    ``decoder_stack`` call, against the layers' own ops one after the other."""
    layers = [_gemma_layer(5, 1e4, 3), _gemma_layer(5, 1e4, 4), _gemma_layer(None, 1e6, 5)]
    layers[1].self_attn.rotary_emb = layers[0].self_attn.rotary_emb
    for i, layer in enumerate(layers):
        layer.self_attn.attn.kv_group = 1 if i == 2 else 0
    gen = torch.Generator().manual_seed(9)
    lens = [4, 17, 9]
    positions, step = _step(lens, 2, gen)
    hidden = torch.randn(len(lens), HIDDEN, generator=gen)
    starts = [_cache(gen) for _ in layers]

    def run(step_through) -> tuple[torch.Tensor, list[torch.Tensor]]:
        for layer, cache in zip(layers, starts, strict=True):
            layer.self_attn.attn.kv_cache = cache.clone()
        with StepHandle(step) as handle:
            out = step_through(handle)
        return out, [layer.self_attn.attn.kv_cache for layer in layers]

    def own_ops(handle: ForwardContextHandle) -> torch.Tensor:
        h = hidden
        for layer in layers:
            h = with_decode_attention(layer, handle)(positions, h)
        return h

    def one_by_one(handle: ForwardContextHandle) -> torch.Tensor:
        h = hidden
        for layer in layers:
            h = FusedDecoderLayer(layer, handle)(positions, h)
        return h

    def stacked(handle: ForwardContextHandle) -> torch.Tensor:
        plan = fused_layers(layers, torch.float32, handle)
        assert isinstance(plan[0], FusedDecoderStack)
        assert all(isinstance(p, RunByStack) for p in plan[1:])
        h = plan[0](positions, hidden)
        for stand_in in plan[1:]:
            h = stand_in(positions, h)  # the one stream passes on unchanged
        return h

    want, want_caches = run(own_ops)
    single, single_caches = run(one_by_one)
    got, got_caches = run(stacked)
    # The stack computes exactly what the fused layers do one by one ...
    assert torch.equal(got, single)
    assert all(torch.equal(g, w) for g, w in zip(got_caches, single_caches, strict=True))
    # ... which is the layers' own computation up to float32 rounding over 3 layers.
    assert ((got - want).norm() / want.norm()).item() < 2e-4
    _assert_close(got_caches, want_caches)
