"""LoRA on the default GGUF model run low-bit (the base stays quantized, the adapter in
float), against HF transformers loading the same GGUF (dequantized, float32) with the
adapter applied by peft: teacher-forced, HF's greedy choice agrees with our tokens
where the adapter moves the output away from the base model's."""

from __future__ import annotations

import functools
import os

import pytest
import torch
from lora_helpers import write_random_adapter

from minivllm import LLM, SamplingParams
from minivllm.lora.request import LoRARequest
from minivllm.transformers_utils.config import default_model_path

PROMPTS = ["The capital of France is", "Here is a short poem about the sea:\n"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def hf_gguf_model() -> torch.nn.Module:
    import gguf
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    with pytest.MonkeyPatch.context() as mp:  # see tests/engine/test_greedy_parity.py
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
        )
    return model.eval()


def agreement(model: torch.nn.Module, prompt_ids: list[int], generated: list[int]) -> float:
    """Share of ``generated`` that ``model`` picks greedily, fed the tokens before each."""
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return float((logits.argmax(-1) == torch.tensor(generated)).float().mean())


@pytest.mark.slow  # loads the GGUF into HF too (~20 s); test_lora_vs_peft covers the math
def test_lora_on_the_low_bit_default_model_follows_peft(tmp_path) -> None:
    from peft import PeftModel

    llm = LLM(enable_lora=True, max_lora_rank=16, optimization_level=0, max_model_len=512)
    config = llm.llm_engine.vllm_config
    assert config.model_config.quantization == "gguf"  # the base runs low-bit
    adapter = write_random_adapter(
        tmp_path / "a", config.model_config.hf_text_config, r=16,
        target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], seed=0, scale=0.1,
    )  # fmt: skip
    tokenizer = llm.get_tokenizer()
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    inputs = [{"prompt_token_ids": ids} for ids in prompt_ids]
    request = LoRARequest("a", 1, str(adapter))
    ours = [o.outputs[0].token_ids for o in llm.generate(inputs, GREEDY, lora_request=request)]
    base = [o.outputs[0].token_ids for o in llm.generate(inputs, GREEDY)]
    assert ours != base
    hf = PeftModel.from_pretrained(hf_gguf_model(), str(adapter)).eval()
    for ids, mine, plain in zip(prompt_ids, ours, base, strict=True):
        assert agreement(hf, ids, list(mine)) >= 0.9
        assert agreement(hf, ids, list(plain)) < 0.9  # the check sees a missing adapter
