"""LoRA under the CPU decode graph (`minivllm.worker.decode_graph`): an -O2 LoRA engine
runs its decode steps in the graph, each row with its own adapter's delta, and its
greedy tokens and log-probabilities match HF transformers + peft (float layers: the
LoRA layers' torch ops traced into the graph) or the piecewise forward of the same
engine (int4 GGUF layers: minivllm's fused C++ decoder stack adds the deltas).

The graph is traced at start-up, before any adapter is loaded: every adapter here
reaches its slot after the trace, and later batches move adapters between slots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_helpers import save_peft_adapter, write_random_adapter
from model_helpers import save_random_hf_model
from test_lora_vs_peft import ADAPTERS, PARAMS, PROMPT, check, reference

from minivllm import LLM, SamplingParams
from minivllm.lora.request import LoRARequest

EAGER_PIECES = {"mode": "VLLM_COMPILE", "backend": "eager"}
"""VLLM_COMPILE with Dynamo's trace run as it is (no Inductor): the decode graph and
its inputs are the same as with Inductor, the start takes seconds."""


def lora_llm(model: Path, **kwargs: Any) -> LLM:
    """An -O2 (VLLM_COMPILE) LoRA engine with the CPU decode graph on."""
    opts: dict[str, Any] = dict(
        dtype="float32", skip_tokenizer_init=True, num_gpu_blocks_override=64,
        block_size=8, max_model_len=128, enable_lora=True, max_lora_rank=16,
    )  # fmt: skip
    opts.update(kwargs)
    saved = os.environ.pop("MINIVLLM_CPU_DECODE_GRAPH", None)
    try:
        return LLM(model=str(model), **opts)
    finally:
        if saved is not None:
            os.environ["MINIVLLM_CPU_DECODE_GRAPH"] = saved


def decode_graph(llm: LLM) -> Any:
    return llm.llm_engine.executor.worker.model_runner.forward_runner.decode_graph


@pytest.fixture(scope="module")
def float_model(tmp_path_factory: pytest.TempPathFactory):
    """The tiny float Llama, its three PEFT adapters (references and requests)."""
    tmp = tmp_path_factory.mktemp("lora_graph")
    hf, _ = save_random_hf_model(tmp / "base", tie_word_embeddings=False)
    refs: dict[str | None, torch.nn.Module] = {None: hf}
    requests: dict[str | None, LoRARequest | None] = {None: None}
    for i, (name, (rank, targets, extra)) in enumerate(ADAPTERS.items(), start=1):
        refs[name] = save_peft_adapter(
            hf, tmp / name, r=rank, target_modules=targets, seed=i, **extra
        )
        requests[name] = LoRARequest(name, i, str(tmp / name))
    return tmp / "base", refs, requests


def test_float_lora_engine_decodes_in_the_graph_and_matches_peft(float_model) -> None:
    path, refs, requests = float_model
    # Two slots for three adapters: the second batch evicts one and loads another.
    llm = lora_llm(path, max_loras=2, compilation_config=EAGER_PIECES)
    graph = decode_graph(llm)
    assert graph is not None and graph.ready
    assert graph.num_fused_layers == 0  # float layers: LoRA layers traced as torch ops
    for names in ([None, "attn_qv", "mlp_o", None], ["all_rs", "attn_qv", None], ["mlp_o"]):
        prompts = [PROMPT[i % 3 :] for i in range(len(names))]
        steps = graph.num_steps
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            PARAMS,
            use_tqdm=False,
            lora_request=[requests[n] for n in names],
        )
        # Every token after the prefill's came from a decode step of the graph.
        assert graph.num_steps - steps >= PARAMS.max_tokens - 1
        for out, name, prompt in zip(outs, names, prompts, strict=True):
            check(out, reference(refs[name], prompt))


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)


def run(llm: LLM, graph_on: bool, loras: list[LoRARequest | None]) -> list[Any]:
    decode_graph(llm).ready = graph_on
    prompts = [[(7 * i + 3 * j) % 120 + 1 for j in range(3 + 5 * i)] for i in range(len(loras))]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False, lora_request=loras
    )
    return [o.outputs[0] for o in outs]


def assert_same(graph: list[Any], piecewise: list[Any]) -> None:
    for g, p in zip(graph, piecewise, strict=True):
        assert list(g.token_ids) == list(p.token_ids)
        for lg, lp in zip(g.logprobs, p.logprobs, strict=True):
            for tok, entry in lp.items():
                assert lg[tok].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_int4_layers_fuse_with_their_lora_deltas(tmp_path: Path) -> None:
    """Q4_1 decoder layers: the graph is one ``minivllm_cpu::decoder_stack`` call a step,
    the deltas inside it, and gives the piecewise forward's tokens for a batch that
    mixes the base and adapters, also after an adapter took another's slot."""
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_tiny_gguf

    from minivllm.kernels import lowbit_cpu

    assert lowbit_cpu.available(), "minivllm's C++ kernels did not build here"
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(model), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    llm = lora_llm(model, max_loras=2, compilation_config=EAGER_PIECES)
    graph = decode_graph(llm)
    assert graph.num_fused_layers == 2
    hf_config = llm.llm_engine.vllm_config.model_config.hf_text_config
    targets = [["q_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"],
               ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]]  # fmt: skip
    loras = [
        LoRARequest(f"a{i}", i + 1, str(write_random_adapter(
            tmp_path / f"a{i}", hf_config, r=r, target_modules=t, seed=i, scale=1.0)))
        for i, (r, t) in enumerate(zip((8, 16, 4), targets, strict=True))
    ]  # fmt: skip
    for batch in ([None, loras[0], loras[1], None], [loras[2], None, loras[0]]):
        piecewise = run(llm, False, batch)
        steps = graph.num_steps
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fused = run(llm, True, batch)
        assert graph.num_steps - steps >= GREEDY.max_tokens - 1
        calls = {e.key: e.count for e in prof.key_averages()}
        assert calls.get("minivllm_cpu::decoder_stack", 0) >= GREEDY.max_tokens - 1
        assert_same(fused, piecewise)
    # The adapters matter: the same prompt under an adapter and under the base differs.
    (base,), (adapted,) = run(llm, True, [None]), run(llm, True, [loras[2]])
    assert abs(base.cumulative_logprob - adapted.cumulative_logprob) > 1e-2


def test_saved_traces_are_keyed_on_the_lora_config() -> None:
    """The decode graph's saved trace lives under the config hash (`local_cache_dir`)
    and is checked against the traced module's tensors (`tensor_signature`): LoRA on or
    off, ``max_loras`` and ``max_lora_rank`` each change both."""
    from transformers import LlamaConfig

    from minivllm.compilation.aot import tensor_signature
    from minivllm.compilation.cache import local_cache_dir
    from minivllm.config.lora import LoRAConfig
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig
    from minivllm.lora.layers import LoRARows, apply_lora
    from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from minivllm.model_executor.models.llama import AttnOptions, LlamaDecoderLayer
    from minivllm.worker.decode_graph import name_lora_mask

    model = ModelConfig()
    variants = [None, LoRAConfig(), LoRAConfig(max_loras=2), LoRAConfig(max_lora_rank=32)]
    configs = [VllmConfig(model_config=model, lora_config=lora) for lora in variants]
    assert len({local_cache_dir(c, "decode_native", record=False) for c in configs}) == 4

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=1)  # fmt: skip

    def signature(slots: int | None, rank: int = 16) -> str:
        layer = LlamaDecoderLayer(
            cfg, RotaryEmbedding(16, 16, 64, {"rope_theta": 1e4}), AttnOptions(), prefix="l"
        )
        if slots is not None:
            rows = LoRARows(slots, 8, torch.float32, torch.device("cpu"))
            apply_lora(layer, ("qkv_proj", "o_proj"), rows, rank, torch.float32)
        view = torch.nn.Module()  # what the decode graph traces: a copy sharing tensors
        view.layer = layer
        name_lora_mask(view, layer)
        return tensor_signature(view)

    # 2 slots of rank 16 stack as many rows as 1 slot of rank 32: the mask tells them apart.
    assert len({signature(None), signature(1), signature(2), signature(1, 32)}) == 4


@pytest.mark.slow  # two Inductor starts; the keyed-trace test and the int4 test cover the parts
def test_a_saved_lora_trace_loads_and_follows_adapters_loaded_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the compile cache on, a second start of the same LoRA engine loads the
    decode graph's saved trace (no Dynamo trace) and still computes with the adapters
    loaded into its slots afterwards, as the first start does."""
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_tiny_gguf

    from minivllm import envs
    from minivllm.compilation.counter import compilation_counter

    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(model), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    root = tmp_path / "root"  # a fresh compile cache; the C++ kernels are shared
    root.mkdir()
    kernels = envs.cache_root() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (root / "kernels").symlink_to(kernels, target_is_directory=True)
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(root))
    tokens = []
    for start in ("cold", "warm"):
        before = compilation_counter.clone()
        llm = lora_llm(model, max_loras=2)
        counts = compilation_counter.delta(before)
        if start == "cold":
            assert counts["num_aot_saves"] == 2  # the model forward and the decode graph
            hf_config = llm.llm_engine.vllm_config.model_config.hf_text_config
            loras = [
                LoRARequest(f"a{i}", i + 1, str(write_random_adapter(
                    tmp_path / f"a{i}", hf_config, r=8, target_modules=["q_proj", "down_proj"],
                    seed=i, scale=1.0)))
                for i in range(2)
            ]  # fmt: skip
        else:
            assert counts.get("num_dynamo_traces", 0) == 0 and counts["num_aot_loads"] == 2
        graph = decode_graph(llm)
        steps = graph.num_steps
        outs = run(llm, True, [loras[0], None, loras[1]])
        assert graph.num_steps - steps >= GREEDY.max_tokens - 1
        tokens.append([(list(o.token_ids), o.cumulative_logprob) for o in outs])
        if start == "cold":  # the adapters matter; the base row is the base's
            plain = [(list(o.token_ids), o.cumulative_logprob) for o in run(llm, True, [None] * 3)]
            assert plain[0] != tokens[0][0] and plain[2] != tokens[0][2]
            assert plain[1][0] == tokens[0][1][0]
        del llm
    assert tokens[0] == tokens[1]
