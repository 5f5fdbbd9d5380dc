"""The fused decoder layer (``minivllm_cpu::decoder_layer``) against the layer's own
ops: a `LlamaDecoderLayer` with low-bit weights, run on one decode step both ways
(its attention a `DecodeAttention`, as in the decode graph's copy of the model, the
step's inputs given by hand), gives the same outputs, residual stream and written
KV cache."""

from __future__ import annotations

import gc

import pytest
import torch
from fused_layer_helpers import StepHandle, set_q4, set_q4_stacked, set_q8_0, with_decode_attention
from transformers import LlamaConfig

from minivllm.attention.forward_context import DecodeStep, ForwardContextHandle
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from minivllm.model_executor.layers.fused_decoder_layer import (
    FusedDecoderLayer,
    FusedDecoderStack,
    RunByStack,
    fusable,
    fused_decoder_stack,
    fused_layers,
    layer_parts,
)
from minivllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm
from minivllm.model_executor.layers.quantized_linear import INT8, Q4
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from minivllm.model_executor.models.llama import AttnOptions, LlamaDecoderLayer

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")

HIDDEN, INTER, NH, NKV, HD = 128, 192, 8, 2, 16
BLOCK, BLOCKS = 4, 64
Q8_0 = -8
STACKED = -4  # a Q4 weight of two segments in different scale forms
"""``kinds`` entry for an ``INT8`` linear on Q8_0's own codes and scales per 32."""


def _config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=NH,
        num_key_value_heads=NKV, head_dim=HD, num_hidden_layers=1, rms_norm_eps=1e-5,
        max_position_embeddings=256,
    )  # fmt: skip


def _layer(kinds: tuple[int, int, int, int], rotary_dim: int, window: int | None):
    gen = torch.Generator().manual_seed(0)
    layer = LlamaDecoderLayer(
        _config(), RotaryEmbedding(HD, rotary_dim, 256, {"rope_theta": 10000.0}),
        AttnOptions(), prefix="layers.0",
    )  # fmt: skip
    attn = layer.self_attn
    attn.attn.sliding_window = window
    linears = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    for linear, kind in zip(linears, kinds, strict=True):
        if kind == Q4:
            set_q4(linear, gen)
        elif kind == Q8_0:
            set_q8_0(linear, gen)
        elif kind == STACKED:
            set_q4_stacked(linear, gen)
        else:
            linear.weight.data = torch.randn(linear.weight.shape, generator=gen) * 0.05
            linear.quantize_int8()
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data = 1 + 0.1 * torch.randn(HIDDEN, generator=gen)
    return layer


def _step(layer, lens: list[int], cache_dtype: torch.dtype, fused: bool, residual: bool):
    """One decode step of ``len(lens)`` requests; returns (out, residual, cache)."""
    gen = torch.Generator().manual_seed(3)
    b = len(lens)
    layer.self_attn.attn.kv_cache = torch.randn(2, BLOCKS, BLOCK, NKV, HD, generator=gen).to(
        cache_dtype
    )
    hidden = torch.randn(b, HIDDEN, generator=gen)
    res = torch.randn(b, HIDDEN, generator=gen) if residual else None
    width = 6  # request i owns blocks 1 + 6 i ..., shuffled
    table = torch.stack([torch.randperm(width, generator=gen) + 1 + width * i for i in range(b)])
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    positions = seq_lens.long() - 1
    slots = table.gather(1, (positions // BLOCK)[:, None]).squeeze(1).long() * BLOCK
    slots += positions % BLOCK
    step = DecodeStep(seq_lens, [table.to(torch.int32)], [slots])
    with StepHandle(step) as handle:
        if fused:
            assert fusable(layer, torch.float32)
            out, new_res = FusedDecoderLayer(layer, handle)(positions, hidden, res)
        else:
            out, new_res = with_decode_attention(layer, handle)(positions, hidden, res)
    return out, new_res, layer.self_attn.attn.kv_cache


@pytest.mark.parametrize(
    "kinds",
    [
        (Q4, Q4, Q4, Q4),
        (INT8, INT8, INT8, INT8),
        (Q8_0,) * 4,
        (Q4, INT8, Q8_0, INT8),
        (STACKED, Q4, STACKED, STACKED),
    ],
    ids=["q4", "int8", "q8_0", "mixed", "stacked"],
)
@pytest.mark.parametrize("lens", [[1], [9, 22, 3], [5, 1, 17, 12, 24, 2, 8, 19, 11, 6]])
def test_fused_layer_matches_the_layer_ops(kinds: tuple[int, int, int, int], lens: list[int]):
    layer = _layer(kinds, HD, None)
    # (The layer's float steps round differently from the ops': ~1e-4 apart on these
    # weights, up to ~3e-4 where an MLP weight's first rows are Q4_0-like.)
    tol = 5e-4 if STACKED in kinds else 1e-4
    for residual in (False, True):
        want = _step(layer, lens, torch.float32, False, residual)
        got = _step(layer, lens, torch.float32, True, residual)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim,window", [(HD, 5), (HD // 2, None)])
def test_fused_layer_cache_dtypes_windows_partial_rotary(
    cache_dtype: torch.dtype, rotary_dim: int, window: int | None
) -> None:
    layer = _layer((Q4, Q4, Q4, Q4), rotary_dim, window)
    lens = [7, 1, 20]
    want = _step(layer, lens, cache_dtype, False, True)
    got = _step(layer, lens, cache_dtype, True, True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("force", [1, 0], ids=["avx2", "portable"])
def test_fused_layer_on_lower_instruction_sets(force: int) -> None:
    best = lowbit_cpu.isa()
    if force > best:
        pytest.skip("this CPU lacks that instruction set")
    layer = _layer((Q4, INT8, Q4, Q8_0), HD, None)
    lowbit_cpu.isa(force)
    try:
        want = _step(layer, [4, 13], torch.float32, False, True)
        got = _step(layer, [4, 13], torch.float32, True, True)
    finally:
        lowbit_cpu.isa(best)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_only_eligible_layers_fuse(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer((Q4, Q4, Q4, Q4), HD, None)
    attn = layer.self_attn
    assert not fusable(layer, torch.float32)  # no KV cache bound yet
    attn.attn.kv_cache = torch.zeros(2, BLOCKS, BLOCK, NKV, HD)
    assert fusable(layer, torch.float32)
    assert not fusable(layer, torch.bfloat16)  # bfloat16 activations
    monkeypatch.setenv("MINIVLLM_CPU_FUSED_LAYERS", "0")
    assert not fusable(layer, torch.float32)
    monkeypatch.delenv("MINIVLLM_CPU_FUSED_LAYERS")
    attn.q_norm = RMSNorm(HD, 1e-5)
    assert not fusable(layer, torch.float32)  # a q norm without a k norm
    attn.k_norm = RMSNorm(HD, 1e-6)
    assert not fusable(layer, torch.float32)  # norms of two epsilons
    attn.k_norm = RMSNorm(HD, 1e-5)
    assert fusable(layer, torch.float32)  # Qwen3's q/k norms
    attn.k_norm = GemmaRMSNorm(HD, 1e-5)
    assert not fusable(layer, torch.float32)  # norms of two kinds
    attn.q_norm = attn.k_norm = None
    attn.o_proj.bias = torch.nn.Parameter(torch.zeros(HIDDEN))
    assert fusable(layer, torch.float32)  # a bias (Qwen2)
    attn.o_proj.bias = torch.nn.Parameter(torch.zeros(HIDDEN, dtype=torch.bfloat16))
    assert not fusable(layer, torch.float32)  # a bias the kernel does not read
    attn.o_proj.bias = None
    layer.mlp.act_fn = GeluAndMul("tanh")
    assert not fusable(layer, torch.float32)  # a Llama-form layer gates with SiLU
    layer.mlp.act_fn = SiluAndMul()
    attn.attn.kv_cache = torch.zeros(2, BLOCKS, BLOCK, NKV, HD, dtype=torch.float16)
    assert not fusable(layer, torch.float32)  # a cache dtype the kernels do not read
    attn.attn.kv_cache = torch.zeros(2, BLOCKS, BLOCK, NKV, HD)
    layer.block_form = "other"  # a layer that does not declare what it computes
    assert not fusable(layer, torch.float32)


def test_stack_of_layers_matches_layer_by_layer() -> None:
    """``decoder_stack`` (the decode graph's one call a step) against the fused
    layers one by one, each writing its own KV cache; layers that differ in a shared
    setting are not stacked."""
    layers = [_layer(kinds, HD, None) for kinds in ((Q4,) * 4, (INT8,) * 4, (Q4, INT8, Q4, Q4))]
    rotary = layers[0].self_attn.rotary_emb
    for layer in layers:
        layer.self_attn.rotary_emb = rotary  # one table, as `LlamaModel` shares it
    lens = [6, 15]
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(len(lens), HIDDEN, generator=gen)

    def caches() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(7)
        return [torch.randn(2, BLOCKS, BLOCK, NKV, HD, generator=g) for _ in layers]

    table = torch.tensor([[6, 2, 18, 14], [4, 10, 22, 26]], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    positions = seq_lens.long() - 1
    slots = table.gather(1, (positions // BLOCK)[:, None]).squeeze(1).long() * BLOCK
    slots += positions % BLOCK
    step = DecodeStep(seq_lens, [table], [slots])
    want_caches = caches()
    h, r = hidden, None
    with StepHandle(step) as handle:
        for layer, cache in zip(layers, want_caches, strict=True):
            layer.self_attn.attn.kv_cache = cache
            h, r = FusedDecoderLayer(layer, handle)(positions, h, r)
    got_caches = caches()
    for layer, cache in zip(layers, got_caches, strict=True):
        layer.self_attn.attn.kv_cache = cache
    got = fused_decoder_stack(positions, hidden, [layer_parts(la) for la in layers], step)
    torch.testing.assert_close(got[0], h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], r, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_caches, want_caches, strict=True):
        assert torch.equal(g, w)
    # The decode graph's form: what never changes bound once, a step passing only
    # its own inputs; the same call underneath, so the same bits.
    bound_caches = caches()
    for layer, cache in zip(layers, bound_caches, strict=True):
        layer.self_attn.attn.kv_cache = cache
    with StepHandle(step) as handle:
        stack = FusedDecoderStack(layers, handle)
        assert stack.binding is not None and stack.binding.dtype == torch.int64
        bound = stack(positions, hidden)
    assert torch.equal(bound[0], got[0]) and torch.equal(bound[1], got[1])
    for b, w in zip(bound_caches, got_caches, strict=True):
        assert torch.equal(b, w)
    # Collecting the module releases the binding (and the tensors it kept alive).
    number = stack.binding.clone()
    del stack
    gc.collect()
    with pytest.raises(RuntimeError, match="no stack is bound"):
        torch.ops.minivllm_cpu.decoder_stack_bound(
            hidden, number, positions, step.block_tables, step.seq_lens, step.slots
        )
    # All fusable and alike: one stack in the first place, the others pass on.
    handle = ForwardContextHandle()
    plan = fused_layers(layers, torch.float32, handle)
    assert isinstance(plan[0], FusedDecoderStack)
    assert all(isinstance(p, RunByStack) for p in plan[1:])
    # Windows may differ per layer (Gemma 3's local and global layers) ...
    layers[1].self_attn.attn.sliding_window = 4
    assert isinstance(fused_layers(layers, torch.float32, handle)[0], FusedDecoderStack)
    # ... a layer of another form may not: each layer fused on its own.
    layers[1].self_attn.q_norm = RMSNorm(HD, 1e-5)
    layers[1].self_attn.k_norm = RMSNorm(HD, 1e-5)
    plan = fused_layers(layers, torch.float32, handle)
    assert all(isinstance(p, FusedDecoderLayer) for p in plan)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIVLLM_CPU_FUSED_LAYERS", "0")
        assert fused_layers(layers, torch.float32, handle) == [None] * len(layers)


@pytest.mark.parametrize(
    "kinds,modules",
    [
        ((Q4, Q4, Q4, Q4), ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),
        ((Q4, INT8, Q4, INT8), ("qkv_proj", "gate_up_proj", "down_proj")),
    ],
    ids=["q4-all", "mixed-no-o"],
)
def test_fused_layer_adds_each_rows_lora_delta(
    kinds: tuple[int, int, int, int], modules: tuple[str, ...]
) -> None:
    """LoRA layers (`LoRALinear`, three slots, ranks up to 8) on the projections: the
    fused layer adds each row's own adapter delta, read from the slots and the slot
    mask in place, as the LoRA layers' torch ops do; rows without an adapter get none."""
    from minivllm.lora.layers import LoRARows, apply_lora

    layer = _layer(kinds, HD, None)
    rows = LoRARows(3, 16, torch.float32, torch.device("cpu"))
    lora = apply_lora(layer, modules, rows, 8, torch.float32)
    gen = torch.Generator().manual_seed(11)
    for slot, rank in enumerate((8, 4, 8)):
        for wrapped in lora.values():
            weights = {
                i: (torch.randn(rank, wrapped.base.input_size, generator=gen) * 0.1,
                    torch.randn(size, rank, generator=gen) * 0.1)
                for i, (_, size) in enumerate(wrapped.slices)
                if slot != 1 or i != 1  # slot 1 leaves k (or up) out
            }  # fmt: skip
            wrapped.set_slot(slot, weights)
    lens = [5, 9, 1, 17, 3]
    rows.set_rows([1, 0, 3, 2, 1])
    want = _step(layer, lens, torch.float32, False, True)
    got = _step(layer, lens, torch.float32, True, True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    # The delta is there: without adapters the rows' outputs change, except the base row's.
    rows.set_rows([0] * len(lens))
    plain = _step(layer, lens, torch.float32, True, True)[0]
    moved = (plain - got[0]).abs().amax(dim=1) > 1e-3
    assert moved.tolist() == [True, False, True, True, True]
    # Slots of another dtype than the fused layer computes in: not fused.
    for wrapped in lora.values():
        wrapped.lora_a = wrapped.lora_a.bfloat16()
    assert not fusable(layer, torch.float32)
