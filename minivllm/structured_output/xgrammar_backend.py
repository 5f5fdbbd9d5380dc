"""The xgrammar backend (``backend="xgrammar"``)."""

from __future__ import annotations

import json
import re
from typing import Any

import torch
import xgrammar as xgr

from minivllm.structured_output.limits import xgrammar_ignored
from minivllm.structured_output.spec import GrammarSpec

# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:NN: ".
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def clean_error(exc: BaseException) -> str:
    """The library's message without the C++ source location."""
    return _CPP_PREFIX.sub("", str(exc)).strip()


def _ebnf_literal(text: str) -> str:
    # JSON string escapes are valid EBNF string escapes in xgrammar.
    return json.dumps(text, ensure_ascii=False)


class XGrammarMatcher:
    """`GrammarMatcher` over an ``xgrammar.GrammarMatcher``."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class XGrammarBackend:
    """Compiles specs with an ``xgrammar.GrammarCompiler`` for one tokenizer."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids or None
        )
        # The manager caches compiled grammars itself (by spec), so xgrammar's own
        # cache would only hold a second copy.
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        try:
            return self._compile(spec)
        except RuntimeError as exc:
            raise ValueError(clean_error(exc)) from None

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        c = self._compiler
        if spec.kind in ("json", "json_object"):
            ignored = xgrammar_ignored(json.loads(spec.text))
            if ignored:
                # "not supported" lets backend "auto" try llguidance, which either
                # enforces these keywords or refuses them too.
                raise ValueError(
                    f"JSON schema keyword(s) {', '.join(ignored)} are not supported by "
                    "xgrammar (the output would not honour them)"
                )
            # strict_mode (on by default) already gives objects without
            # "additionalProperties" no unlisted keys, so no_additional_properties holds.
            return c.compile_json_schema(spec.text, any_whitespace=spec.any_whitespace)
        if spec.kind == "regex":
            return c.compile_regex(spec.text)
        if spec.kind == "choice":
            choices = json.loads(spec.text)
            return c.compile_grammar("root ::= " + " | ".join(map(_ebnf_literal, choices)))
        if spec.kind == "grammar":
            return c.compile_grammar(spec.text)
        if spec.kind == "structural_tag":
            return c.compile_structural_tag(spec.text)
        raise ValueError(f"unknown structured output kind {spec.kind!r}")

    def size_bytes(self, compiled: xgr.CompiledGrammar) -> int:
        return int(compiled.memory_size_bytes)

    def new_matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(compiled)
