"""`StructuredOutputManager`: picks the backend of a request and compiles its grammar
once, cached by the grammar's text and options (bounded in bytes), after probing its
first steps for masks that are too slow or allow nothing."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from minivllm.logger import init_logger
from minivllm.structured_output.limits import flag
from minivllm.structured_output.probe import GrammarProber
from minivllm.structured_output.spec import CompiledGrammar, GrammarBackend, GrammarSpec

if TYPE_CHECKING:
    from minivllm.config.structured_outputs import StructuredOutputsConfig
    from minivllm.sampling_params import StructuredOutputsParams

logger = init_logger(__name__)

REFUSED_CACHE_SIZE = 256
"""Grammars refused by the probe that are remembered (so a repeat is not recompiled)."""

_KIND_NAMES = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}


class StructuredOutputManager:
    """Compiles the grammars of requests for one tokenizer and vocabulary.

    Thread-safe: the API server compiles (validates) in worker threads while the
    engine thread looks grammars up.  Backends are built on first use (xgrammar
    reads the vocabulary once, which takes a fraction of a second).
    """

    def __init__(
        self,
        config: StructuredOutputsConfig,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
    ) -> None:
        self.config = config
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._backends: dict[str, GrammarBackend] = {}
        self._cache: OrderedDict[tuple[str, GrammarSpec], CompiledGrammar] = OrderedDict()
        self.cache_bytes = 0
        """Memory estimate of the cached grammars (<= config.cache_max_bytes)."""
        self._prober: GrammarProber | None = None
        self._refused: OrderedDict[tuple[str, GrammarSpec], str] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiles = 0
        """Grammars compiled so far (cache misses)."""
        self.compile_seconds = 0.0
        """Time spent compiling them."""

    def _backend(self, name: str) -> GrammarBackend:
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                if name == "xgrammar":
                    from minivllm.structured_output.xgrammar_backend import XGrammarBackend

                    backend = XGrammarBackend(
                        self._tokenizer, self._vocab_size, self._stop_token_ids
                    )
                else:
                    from minivllm.structured_output.guidance_backend import GuidanceBackend

                    backend = GuidanceBackend(
                        self._tokenizer, self._vocab_size, self._stop_token_ids
                    )
                self._backends[name] = backend
            return backend

    def grammar_for(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar of ``params`` (cached); ValueError naming what is wrong."""
        spec = GrammarSpec.from_params(params, self.config)
        if self.config.backend != "auto":
            return self._compile(self.config.backend, spec)
        try:
            return self._compile("xgrammar", spec)
        except ValueError as first:
            # Only a feature xgrammar lacks is worth a second try; a syntax error (a bad
            # regex, say) would fail in llguidance too, after building its vocabulary.
            message = str(first).lower()
            if "unsupported" not in message and "not supported" not in message:
                raise
            if params.disable_fallback or self.config.disable_fallback:
                raise
            try:
                grammar = self._compile("guidance", spec)
            except ValueError:
                raise first from None
            logger.info("xgrammar cannot compile this %s; llguidance can", spec.kind)
            return grammar

    def _compile(self, backend_name: str, spec: GrammarSpec) -> CompiledGrammar:
        key = (backend_name, spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            refused = self._refused.get(key)
        if refused is not None:  # the same slow or empty grammar again: no second compile
            raise ValueError(refused)
        backend = self._backend(backend_name)
        start = time.perf_counter()
        what = _KIND_NAMES.get(spec.kind, spec.kind)
        try:
            compiled = backend.compile(spec)
        except Exception as exc:  # the libraries raise RuntimeError, TypeError, ...
            raise ValueError(f"invalid {what} for structured outputs: {exc}") from None
        grammar = CompiledGrammar(spec, backend, compiled, backend.size_bytes(compiled))
        limit = self.config.max_grammar_bytes
        if grammar.size_bytes > limit:
            raise ValueError(
                f"the compiled {what} takes {grammar.size_bytes} bytes, over the limit "
                f"max_grammar_bytes={limit} ({flag('max_grammar_bytes')}); send a smaller one"
            )
        with self._lock:
            self.num_compiles += 1
            self.compile_seconds += time.perf_counter() - start
            if self._prober is None:
                self._prober = GrammarProber(
                    self._tokenizer, self._vocab_size, self._stop_token_ids, self.config
                )
            prober = self._prober
        try:
            prober.probe(grammar, what)
        except ValueError as exc:
            with self._lock:
                self._refused[key] = str(exc)
                while len(self._refused) > REFUSED_CACHE_SIZE:
                    self._refused.popitem(last=False)
            raise
        with self._lock:
            if key not in self._cache:
                self._cache[key] = grammar
                self.cache_bytes += grammar.size_bytes
            while self.cache_bytes > self.config.cache_max_bytes:
                _, dropped = self._cache.popitem(last=False)
                self.cache_bytes -= dropped.size_bytes
        return grammar
