"""Custom ops: native and optimized paths agree; the config picks one and counts it."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.attention import AttentionConfig
from minivllm.config.cache import CacheConfig
from minivllm.config.compilation import CompilationConfig
from minivllm.config.device import DeviceConfig
from minivllm.config.vllm import set_current_vllm_config
from minivllm.model_executor.custom_op import op_registry
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding


def stand_in_config(custom_ops: list[str]) -> types.SimpleNamespace:
    """A VllmConfig stand-in with the sub-configs the layers read."""
    return types.SimpleNamespace(
        compilation_config=CompilationConfig(custom_ops=custom_ops),
        cache_config=CacheConfig(),
        attention_config=AttentionConfig(),
        device_config=DeviceConfig(device="cpu"),
        model_config=None,
    )


def both_paths(factory):
    with set_current_vllm_config(stand_in_config(["all"])):
        fast = factory()
    with set_current_vllm_config(stand_in_config(["none"])):
        native = factory()
    native.load_state_dict(fast.state_dict())
    assert fast.use_optimized and not native.use_optimized
    return fast, native


TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_paths_agree(dtype):
    fast, native = both_paths(lambda: RMSNorm(48, eps=1e-5))
    with torch.no_grad():
        fast.weight.normal_()
        native.weight.copy_(fast.weight)
    fast, native = fast.to(dtype), native.to(dtype)
    x = torch.randn(7, 48, dtype=dtype) * 3
    res = torch.randn(7, 48, dtype=dtype)
    torch.testing.assert_close(fast(x), native(x), **TOL[dtype])
    out_f, res_f = fast(x, res)
    out_n, res_n = native(x, res)
    torch.testing.assert_close(out_f, out_n, **TOL[dtype])
    torch.testing.assert_close(res_f, x + res)
    torch.testing.assert_close(res_n, x + res)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_paths_agree(dtype):
    fast, native = both_paths(SiluAndMul)
    x = torch.randn(5, 64, dtype=dtype)
    expected = torch.nn.functional.silu(x[:, :32].float()) * x[:, 32:].float()
    torch.testing.assert_close(native(x).float(), expected, **TOL[dtype])
    torch.testing.assert_close(fast(x), native(x), **TOL[dtype])


@settings(max_examples=20, deadline=None)
@given(
    num_tokens=st.integers(1, 9),
    rotary_dim=st.sampled_from([16, 32]),
    theta=st.sampled_from([1e4, 5e5]),
    seed=st.integers(0, 2**16),
)
def test_rotary_paths_agree(num_tokens, rotary_dim, theta, seed):
    params = {"rope_theta": theta, "rope_type": "default"}
    fast, native = both_paths(lambda: RotaryEmbedding(32, rotary_dim, 512, params))
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 512, (num_tokens,), generator=gen)
    q = torch.randn(num_tokens, 4 * 32, generator=gen)
    k = torch.randn(num_tokens, 2 * 32, generator=gen)
    qf, kf = fast(pos, q, k)
    qn, kn = native(pos, q, k)
    torch.testing.assert_close(qf, qn, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kf, kn, atol=1e-5, rtol=1e-5)
    # A rotation keeps each rotated pair's norm; position 0 is the identity.
    torch.testing.assert_close(qf.norm(dim=-1), q.norm(dim=-1), atol=1e-4, rtol=1e-4)
    q0, _ = fast(torch.zeros_like(pos), q, k)
    torch.testing.assert_close(q0, q)


def test_rotary_matches_hf_llama3_scaling():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from minivllm.model_executor.layers.rotary_embedding import rope_parameters_from_config

    rope = {
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_parameters=rope)
    hf = LlamaRotaryEmbedding(cfg)
    ours = RotaryEmbedding(32, 32, 256, rope_parameters_from_config(cfg))
    torch.testing.assert_close(ours.inv_freq, hf.inv_freq.float())


@pytest.mark.parametrize("attention_factor", [None, 1.25])
def test_rotary_matches_hf_yarn_scaling(attention_factor):
    """YaRN: HF's frequencies and its cos/sin scaled by the attention factor."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from minivllm.model_executor.layers.rotary_embedding import rope_parameters_from_config

    rope = {
        "rope_type": "yarn",
        "rope_theta": 1e4,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    if attention_factor is not None:
        rope["attention_factor"] = attention_factor
    cfg = LlamaConfig(
        hidden_size=64, num_attention_heads=2, max_position_embeddings=256, rope_parameters=rope
    )
    hf = LlamaRotaryEmbedding(cfg)
    ours = RotaryEmbedding(32, 32, 256, rope_parameters_from_config(cfg))
    torch.testing.assert_close(ours.inv_freq, hf.inv_freq.float())
    assert ours.mscale == pytest.approx(hf.attention_scaling)
    assert ours.mscale != 1.0
    positions = torch.arange(0, 256, 17)
    x = torch.zeros(1, positions.numel(), 32)
    cos, sin = hf(x, positions[None])
    q = torch.randn(positions.numel(), 32)
    k = torch.randn(positions.numel(), 32)
    rot_q = q * cos[0] + torch.cat([-q[:, 16:], q[:, :16]], -1) * sin[0]
    for q_out, _ in (ours.forward_native(positions, q, k), ours.forward_optimized(positions, q, k)):
        torch.testing.assert_close(q_out, rot_q, atol=1e-5, rtol=1e-5)


def test_counters_follow_custom_ops_flags():
    cfg = stand_in_config(["none", "+rms_norm", "+rotary_embedding"])
    compilation_config = cfg.compilation_config
    with set_current_vllm_config(cfg):
        norms = [RMSNorm(8), RMSNorm(8)]
        act = SiluAndMul()
        rope = RotaryEmbedding(8, 8, 16, {"rope_theta": 1e4})
    assert all(n.use_optimized for n in norms) and rope.use_optimized
    assert not act.use_optimized
    assert compilation_config.enabled_custom_ops == {"rms_norm": 2, "rotary_embedding": 1}
    assert compilation_config.disabled_custom_ops == {"silu_and_mul": 1}

    cfg = stand_in_config(["all", "-silu_and_mul"])
    with set_current_vllm_config(cfg):
        assert not SiluAndMul().use_optimized
        assert RMSNorm(8).use_optimized
    assert cfg.compilation_config.disabled_custom_ops == {"silu_and_mul": 1}


def test_no_config_means_optimized_and_registry_names():
    assert RMSNorm(4).use_optimized and SiluAndMul().use_optimized
    assert {"rms_norm", "silu_and_mul", "rotary_embedding"} <= set(op_registry)


def test_whole_model_native_equals_optimized():
    from mx_helpers import PagedRunner
    from transformers import LlamaConfig

    from minivllm.model_executor.loader import load_model

    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    logits = []
    for ops in (["all"], ["none"]):
        vcfg = stand_in_config(ops)
        with set_current_vllm_config(vcfg):
            model = load_model(None, cfg, torch.float32, load_format="dummy")
        assert set(vcfg.compilation_config.static_forward_context) == {
            f"model.layers.{i}.self_attn.attn" for i in range(2)
        }
        logits.append(PagedRunner(model).step([("a", list(range(10)))]))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_rotary_table_covers_the_engines_max_model_len() -> None:
    # Built for an engine, the cos/sin table stops at its max_model_len (Gemma 3's
    # two 32k-position tables are a quarter of its file); alone, at max_position.
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig

    params = {"rope_theta": 10000.0, "rope_type": "default"}
    assert RotaryEmbedding(32, 32, 4096, params).cos_sin_cache.shape[0] == 4096
    with set_current_vllm_config(VllmConfig(model_config=ModelConfig(max_model_len=300))):
        short = RotaryEmbedding(32, 32, 4096, params)
    assert short.cos_sin_cache.shape[0] == 300
    pos = torch.tensor([0, 1, 150, 299])
    q, k = torch.randn(4, 4 * 32), torch.randn(4, 2 * 32)
    for got, want in zip(
        short.forward_optimized(pos, q, k), short.forward_native(pos, q, k), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
