"""The llguidance backend (``backend="guidance"``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from minivllm.structured_output.limits import subschemas
from minivllm.structured_output.spec import GrammarSpec

GUIDANCE_BYTES_PER_CHAR = 4
"""Memory estimate of a compiled llguidance grammar per character of its text."""


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema without "additionalProperties"
    gets false (iterative: the nesting depth is the request's)."""
    schema = copy.deepcopy(schema)  # depth already bounded by max_spec_depth
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if node.get("type") == "object" or "properties" in node:
            node.setdefault("additionalProperties", False)
        stack.extend(subschemas(node))
    return schema


class GuidanceMatcher:
    """`GrammarMatcher` over an ``llguidance.LLMatcher``.

    llguidance stops by itself once nothing can extend the text; the request must
    still end, so a stopped matcher allows only the stop tokens, and counts as
    terminated once one is accepted (as xgrammar's matcher does).
    """

    def __init__(
        self, tokenizer: llguidance.LLTokenizer, grammar: str, stop_token_ids: list[int]
    ) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar)
        self._stop_token_ids = stop_token_ids
        self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if not self._matcher.is_stopped():
            llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, row)
            return
        bitmask[row] = 0
        for token_id in self._stop_token_ids:
            word, bit = divmod(token_id, 32)
            bitmask[row, word] |= _bit(bit)

    def accept_token(self, token_id: int) -> bool:
        if self._matcher.is_stopped():
            self._terminated = token_id in self._stop_token_ids
            return self._terminated
        accepted = bool(self._matcher.consume_token(token_id))
        if accepted and token_id in self._stop_token_ids:
            self._terminated = True
        return accepted

    def is_terminated(self) -> bool:
        return self._terminated


def _bit(index: int) -> int:
    """Bit ``index`` of an int32 word, as a Python int torch stores in int32."""
    return -(1 << 31) if index == 31 else 1 << index


class GuidanceBackend:
    """Turns specs into llguidance grammars and validates them for one tokenizer."""

    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids or None
        )
        self._stop_token_ids = list(stop_token_ids)

    def compile(self, spec: GrammarSpec) -> str:
        grammar = self._grammar(spec)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise ValueError(error.strip())
        return grammar

    def _grammar(self, spec: GrammarSpec) -> str:
        defaults = {"whitespace_flexible": spec.any_whitespace}
        if spec.kind in ("json", "json_object"):
            schema = json.loads(spec.text)
            if spec.no_additional_properties:
                schema = close_objects(schema)
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)
        if spec.kind == "regex":
            return llguidance.grammar_from("regex", spec.text)
        if spec.kind == "choice":
            return llguidance.grammar_from("choice", spec.text)
        if spec.kind == "grammar":
            # llguidance reads Lark, and GBNF/EBNF as well.
            return llguidance.grammar_from("grammar", spec.text)
        raise ValueError(f"structured output kind {spec.kind!r} is not supported by llguidance")

    def size_bytes(self, compiled: str) -> int:
        # The cached grammar is its text; LLMatcher builds its parser per request.
        return GUIDANCE_BYTES_PER_CHAR * len(compiled)

    def new_matcher(self, compiled: str) -> GuidanceMatcher:
        return GuidanceMatcher(self._tokenizer, compiled, self._stop_token_ids)
