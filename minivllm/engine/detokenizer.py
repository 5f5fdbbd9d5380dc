"""Incremental detokenization with stop strings, for streaming outputs.

Decoding one token at a time is wrong in two ways: a byte-level token may end in
the middle of a UTF-8 character (decoding it alone gives "\\ufffd"), and some
decoders change how a token renders depending on what precedes it (sentencepiece
drops the leading space of the first token).  So, as vLLM does, we keep two
offsets into the ids: text is decoded from ``prefix_offset`` (a few tokens of
context that were already emitted) and compared with the decoding of the context
alone; the difference is the new text, emitted only once it does not end in an
incomplete character.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# Prompt tokens used as decoding context for the first generated token.
_INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


def find_stop_string(
    text: str, num_new_chars: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Look for a stop string that ends in the last ``num_new_chars`` characters.

    Returns ``(stop_string, truncate_to)`` where ``truncate_to`` is the length the
    text must be cut to (-1: no cut needed), or None when no stop string matched.
    Only a window reaching back one stop-string length before the new text is
    searched, since older text was already checked.
    """
    if num_new_chars <= 0:
        return None
    for stop_str in stop:
        start = max(len(text) - num_new_chars - len(stop_str) + 1, 0)
        index = text.find(stop_str, start)
        if index == -1:
            continue
        if not include_in_output:
            return stop_str, index
        end = index + len(stop_str)
        return stop_str, (-1 if end >= len(text) else end)
    return None


class IncrementalDetokenizer:
    """Turns a request's generated ids into text as they arrive, and spots stop strings."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens
        # Hold back enough characters that a stop string (which gets cut off) is never
        # streamed in part; when it stays in the output there is nothing to hold back.
        self.stop_buffer_length = (
            max(len(s) for s in self.stop) - 1
            if self.stop and not include_stop_str_in_output
            else 0
        )

        # Only the tail of the prompt matters as decoding context.
        context = list(prompt_token_ids[-_INITIAL_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._num_prompt_context = len(context)
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self._num_streamed_chars = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def _decode_next(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT_CHAR):
            # Incomplete character (or a token that renders as nothing yet): wait.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Keep the id window short; everything before prefix_offset is never decoded again.
        if self._prefix_offset > 64:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return full_text[len(prefix_text) :]

    def update(self, new_token_ids: Sequence[int], stop_terminated: bool = False) -> str | None:
        """Append newly generated ids; return the stop string they completed, if any.

        ``stop_terminated`` says the last id is a stop token (EOS or a stop_token_id):
        unless stop strings are kept in the output, that token is recorded but not
        rendered.  When a stop string matches, ``output_text`` is cut at its start
        (or its end, with include_stop_str_in_output).  Stop strings are not looked
        for until more than ``min_tokens`` tokens have been generated.
        """
        if not new_token_ids:
            return None
        to_render = list(new_token_ids)
        skipped_stop_id = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped_stop_id = to_render.pop()

        check_from = len(self.output_text)
        for token_id in to_render:
            self.output_token_ids.append(token_id)
            self.output_text += self._decode_next(token_id)
            if self.min_tokens and len(self.output_token_ids) <= self.min_tokens:
                # Text made while stop strings are not allowed is never searched.
                check_from = len(self.output_text)
        if skipped_stop_id is not None:
            self.output_token_ids.append(skipped_stop_id)

        if not self.stop or len(self.output_token_ids) <= self.min_tokens:
            return None
        match = find_stop_string(
            self.output_text,
            len(self.output_text) - check_from,
            self.stop,
            self.include_stop_str_in_output,
        )
        if match is None:
            return None
        stop_str, truncate_to = match
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to send now: all of it, or (``delta``) what was not sent yet.

        While the request runs the last ``stop_buffer_length`` characters are held
        back, as they may turn out to begin a stop string; a finished request
        releases everything.
        """
        held_back = 0 if finished else self.stop_buffer_length
        ready = max(len(self.output_text) - held_back, 0)
        if not delta:
            return self.output_text[:ready]
        if ready <= self._num_streamed_chars:
            return ""
        text = self.output_text[self._num_streamed_chars : ready]
        self._num_streamed_chars = ready
        return text
