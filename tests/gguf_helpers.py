"""A tiny random Llama written as a GGUF file, as llama.cpp's converter would."""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from transformers import LlamaConfig, LlamaForCausalLM

HEADS, KV_HEADS = 4, 2
_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows (the inverse of our unpermute)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_tiny_gguf(
    path: str,
    tie: bool,
    num_layers: int = 2,
    all_q8_0: bool = False,
    layer_type: QT | None = None,
) -> None:
    """A random llama in GGUF: Q8_0 MLP, F16 attention/embedding, F32 norms
    (``all_q8_0``: every matrix Q8_0, the embedding and LM head too;
    ``layer_type``: every decoder-layer matrix of that type, e.g. Q4_1)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=128, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=tie,
    )  # fmt: skip
    sd = {k: v.detach().numpy() for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(num_layers)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(128)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    for name, value in sd.items():
        base = name.removesuffix(".weight")
        if base in top:
            if tie and base == "lm_head":
                continue
            g = top[base]
        else:
            parts = base.split(".")
            g = f"blk.{parts[2]}.{_GGUF_NAMES['.'.join(parts[3:])]}"
        if g.endswith("attn_q"):
            value = llama_cpp_permute(value, HEADS)
        elif g.endswith("attn_k"):
            value = llama_cpp_permute(value, KV_HEADS)
        if value.ndim == 1:
            w.add_tensor(g + ".weight", value.astype(np.float32))
        elif layer_type is not None and g.startswith("blk."):
            quant = gguf.quants.quantize(value.astype(np.float32), layer_type)
            w.add_tensor(g + ".weight", quant, raw_dtype=layer_type)
        elif "ffn" in g or all_q8_0:
            quant = gguf.quants.quantize(value.astype(np.float32), QT.Q8_0)
            w.add_tensor(g + ".weight", quant, raw_dtype=QT.Q8_0)
        else:
            w.add_tensor(g + ".weight", value.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
