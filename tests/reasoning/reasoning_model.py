"""A tiny random-weight reasoning model for end-to-end tests: the default model's
tokenizer with ``<think>`` / ``</think>`` added as tokens, and a Qwen3-style chat
template that opens the answer with ``<think>`` (or, with ``enable_thinking: false``,
writes an empty, closed thinking block into the prompt)."""

from __future__ import annotations

import copy
from pathlib import Path

from model_helpers import save_random_hf_model

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{%- else -%}{{ '<think>\n' }}{%- endif -%}"
    "{%- endif -%}"
)
"""ChatML, thinking on by default (the template opens it, as Qwen3.5 and DeepSeek R1 do)."""


def build_reasoning_model(path: Path) -> Path:
    """Write the model directory (config, random weights, tokenizer) to ``path``."""
    from minivllm.tokenizer import get_tokenizer
    from minivllm.transformers_utils.config import default_model_path

    # A copy: get_tokenizer caches its tokenizers, and other tests share this one.
    tokenizer = copy.deepcopy(get_tokenizer(default_model_path()))
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    save_random_hf_model(
        path,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        seed=3,
    )
    return path
