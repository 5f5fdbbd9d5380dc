"""Tokenizer loading (HF directories and GGUF files) and chat-template rendering.

A GGUF file carries no ``tokenizer.json``; its vocabulary, merges, special token ids
and chat template live in the metadata under llama.cpp's key names.  Transformers can
turn that metadata into a fast tokenizer, but going through
``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` also parses the model config
and takes many seconds.  We read only the tokenizer keys and call transformers'
converter directly, which gives the same tokenizer in well under a second.

Nothing here downloads anything: every path must exist locally.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minivllm.logger import init_logger

logger = init_logger(__name__)

# Gemma 3's turn format, for GGUF files that ship without tokenizer.chat_template (the
# 270M file has none): a system message is folded into the first user turn, the
# assistant's role is called "model", and each turn ends with <end_of_turn>.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('\n\n') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = ns.system + text + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role'])"
    " + '\n' + ns.system + (text | trim) + '<end_of_turn>\n' }}"
    "{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
"""Chat template used for Gemma 3 GGUF files whose metadata carries none."""
_DEFAULT_GGUF_CHAT_TEMPLATES = {"gemma3": GEMMA3_CHAT_TEMPLATE}

# Files whose presence marks a directory as an HF tokenizer directory.
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def get_tokenizer(
    model_path: str,
    tokenizer: str | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedTokenizerBase:
    """Load (once per distinct argument tuple) the tokenizer for a local model.

    ``tokenizer`` overrides where the tokenizer is read from; by default it is read
    from ``model_path``.  Either may be an HF directory or a ``.gguf`` file (a
    directory whose only tokenizer source is a single ``.gguf`` file works too).
    The result is cached and shared: callers must not mutate it.
    """
    source = os.fspath(tokenizer if tokenizer is not None else model_path)
    path = _resolve_source(os.path.abspath(os.path.expanduser(source)))
    return _load_tokenizer(path, trust_remote_code)


def _resolve_source(path: str) -> str:
    """The .gguf file or HF directory to read, so that cache keys are canonical."""
    if not os.path.exists(path):
        raise ValueError(
            f"Tokenizer path {path!r} does not exist. minivllm never downloads from a model "
            "hub: pass a local HF directory or a local .gguf file."
        )
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(
                f"Tokenizer path {path!r} is a file but not a .gguf file; pass a .gguf file "
                "or a directory holding tokenizer.json / tokenizer_config.json."
            )
        return path
    if any(os.path.exists(os.path.join(path, name)) for name in _HF_TOKENIZER_FILES):
        return path
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return os.path.join(path, ggufs[0])
    raise ValueError(
        f"No tokenizer found in {path!r}: expected one of {list(_HF_TOKENIZER_FILES)} "
        f"or exactly one .gguf file (found {len(ggufs)}). Pass the tokenizer path "
        "explicitly with `tokenizer=`."
    )


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    if path.endswith(".gguf") and os.path.isfile(path):
        return load_gguf_tokenizer(path)
    return AutoTokenizer.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )


def load_gguf_tokenizer(gguf_path: str) -> PreTrainedTokenizerBase:
    """Build the fast tokenizer a GGUF file describes, without loading the model.

    Produces the same tokenizer as ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``:
    same backend, same special tokens (bos/eos/pad/unk), same ``add_bos_token`` flag
    and the file's ``tokenizer.chat_template``.
    """
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        # Older transformers (4.x) has a different converter API; its own loader is
        # slower but equivalent, so fall back to it rather than duplicate that code.
        logger.info("transformers has no GGUF tokenizer helpers; using AutoTokenizer (slow).")
        return AutoTokenizer.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
        )

    cache_dir = _converted_tokenizer_dir(gguf_path)
    cached = _read_converted(cache_dir, gguf_path, TokenizersBackend)
    if cached is not None:
        return cached
    # One pass over the metadata: the reader keeps only the tokenizer string arrays.
    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(gguf_path)
    if not tokenizer_dict.get("tokens"):
        raise ValueError(
            f"{gguf_path!r} has no tokenizer.ggml.tokens metadata; pass an HF tokenizer "
            "directory with `tokenizer=`."
        )
    backend, extra_kwargs = convert_gguf_tokenizer(architecture, tokenizer_dict)
    kwargs = {**tokenizer_config, **extra_kwargs}
    if not kwargs.get("chat_template") and architecture in _DEFAULT_GGUF_CHAT_TEMPLATES:
        kwargs["chat_template"] = _DEFAULT_GGUF_CHAT_TEMPLATES[architecture]
    _write_converted(cache_dir, backend, kwargs)
    # Keep a real name so error messages and reprs say where the tokenizer came from.
    kwargs.setdefault("name_or_path", gguf_path)
    return TokenizersBackend(tokenizer_object=backend, **kwargs)


def _converted_tokenizer_dir(gguf_path: str) -> Path:
    """Where the tokenizer converted from ``gguf_path`` is kept: keyed by the file (path,
    size, modification time) and the converting libraries' versions.

    Converting reads every vocabulary string of the metadata and builds the tokenizer
    in Python: 4.2-4.6 s of a warm start for Gemma 3's 262k-token vocabulary, 1.3 s
    when read back from ``tokenizer.json`` (2-core Sapphire Rapids)."""
    import tokenizers
    import transformers

    from minivllm.envs import cache_root

    stat = os.stat(gguf_path)
    key = "|".join(
        (
            os.path.realpath(gguf_path),
            str(stat.st_size),
            str(stat.st_mtime_ns),
            transformers.__version__,
            tokenizers.__version__,
        )
    )
    return cache_root() / "gguf_tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _read_converted(
    cache_dir: Path, gguf_path: str, backend_cls: type[PreTrainedTokenizerBase]
) -> PreTrainedTokenizerBase | None:
    """The saved conversion, or None.  Built from the file itself (``tokenizer_file``):
    a ``tokenizer_object`` is deep-copied by transformers, which for Gemma 3's
    vocabulary took 1.4 s more than reading it."""
    try:
        kwargs = json.loads((cache_dir / "kwargs.json").read_text())
        kwargs.setdefault("name_or_path", gguf_path)
        path = cache_dir / "tokenizer.json"
        if not path.is_file():
            return None
        return backend_cls(tokenizer_file=str(path), **kwargs)
    except Exception:  # absent or unreadable (tokenizers raises plain Exception): convert
        return None


def _write_converted(cache_dir: Path, backend: Any, kwargs: dict[str, Any]) -> None:
    """Save a converted tokenizer for later starts; a cache that cannot be written (a
    read-only disk, kwargs that are not JSON) only costs the next start the conversion."""
    tmp: Path | None = None
    try:
        text = json.dumps(kwargs)
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent))
        backend.save(str(tmp / "tokenizer.json"))
        (tmp / "kwargs.json").write_text(text)
        os.replace(tmp, cache_dir)  # whole or not at all; a concurrent writer's copy is equal
    except (OSError, TypeError, ValueError) as exc:
        logger.debug("not caching the converted GGUF tokenizer in %s: %s", cache_dir, exc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    add_generation_prompt: bool = True,
    tokenize: bool = False,
    chat_template: str | None = None,
    **template_kwargs: Any,
) -> str | list[int]:
    """Render a conversation with the model's chat template.

    Returns the prompt text, or its token ids when ``tokenize`` is true.  The ids are
    the rendered text encoded without adding special tokens, because the template
    already writes any BOS/role markers itself (adding them again would double BOS).
    """
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if not template:
        raise ValueError(
            f"The tokenizer of {tokenizer.name_or_path!r} has no chat template, so chat "
            "messages cannot be turned into a prompt. Pass a Jinja template explicitly "
            "(chat_template=...) or use plain-text completion instead."
        )
    text = tokenizer.apply_chat_template(
        list(messages),
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **template_kwargs,
    )
    assert isinstance(text, str)
    if not tokenize:
        return text
    return list(tokenizer.encode(text, add_special_tokens=False))
