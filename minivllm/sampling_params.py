"""Per-request sampling parameters, with vLLM's fields, defaults and validation.

This module is imported by the scheduler, which must stay torch-free, so it only
uses the standard library.
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from minivllm.logger import init_logger

logger = init_logger(__name__)

# Temperatures below this are treated as greedy decoding.
SAMPLING_EPS = 1e-5
# Positive temperatures below this blow logits up to inf/nan, so they are raised to it.
MIN_RANDOM_TEMPERATURE = 1e-2
# The hottest temperature accepted: past ~10 sampling is already close to uniform, and
# a temperature beyond float32's range (3.4e38) scales the logits to inf / NaN.
MAX_TEMPERATURE = 100.0
# repetition_penalty's range: dividing logits by a tiny penalty overflows them to inf.
MIN_REPETITION_PENALTY = 1e-2
MAX_REPETITION_PENALTY = 100.0
# logit_bias values' range (OpenAI's documented one).
MAX_LOGIT_BIAS = 100.0
# How a request whose constraints (allowed_token_ids, a grammar, biases) left no token
# to sample fails; the server answers it with a 400.
NO_ALLOWED_TOKEN_ERROR = "every token was masked out"
# vLLM's ModelConfig.max_logprobs default: the most logprobs a request may ask for.
DEFAULT_MAX_LOGPROBS = 20
# The seeds torch.Generator.manual_seed takes (a 64-bit value, signed or unsigned);
# anything outside overflows inside torch ("Overflow when unpacking long long").
MIN_SEED = -(1 << 63)
MAX_SEED = (1 << 64) - 1


class SamplingType(enum.IntEnum):
    """How a request picks its next token."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.Enum):
    """What each streamed `RequestOutput` of a request carries."""

    CUMULATIVE = 0
    """Everything generated so far, every time."""
    DELTA = 1
    """Only what is new since the previous output."""
    FINAL_ONLY = 2
    """Nothing until the request finishes, then everything."""


def _check_range(name: str, value: float, low: float, high: float) -> None:
    # Written so that NaN fails too (every comparison with NaN is False).
    if isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}.")


@dataclass
class StructuredOutputsParams:
    """A constraint on the text of a completion (vLLM's class; set exactly one of
    json, regex, choice, grammar, json_object, structural_tag).

    The grammar is compiled when the request is added (a bad one is a ValueError
    then) and masks, at every step, the tokens that would break it.
    """

    json: str | dict[str, Any] | None = None
    """A JSON schema (a dict or its JSON text) the output must satisfy."""
    regex: str | None = None
    """A regular expression the whole output must match."""
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A context-free grammar: EBNF/GBNF for xgrammar, Lark for llguidance."""
    json_object: bool | None = None
    """Any JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""
    disable_fallback: bool = False
    """Fail instead of falling back to another backend (overrides the engine's)."""
    disable_any_whitespace: bool = False
    """No free whitespace inside generated JSON (or the engine's setting)."""
    disable_additional_properties: bool = False
    """Objects of a JSON schema accept no unlisted properties (or the engine's setting)."""
    whitespace_pattern: str | None = None
    """Accepted for vLLM compatibility (an outlines option); must stay None."""
    structural_tag: str | None = None
    """An xgrammar structural tag (JSON text)."""

    def __post_init__(self) -> None:
        kinds = self.kinds()
        if len(kinds) != 1:
            got = f"got {', '.join(kinds)}" if kinds else "got none"
            raise ValueError(
                "structured outputs need exactly one of json, regex, choice, grammar, "
                f"json_object, structural_tag ({got})"
            )
        if self.choice is not None:
            choice = self.choice
            if not isinstance(choice, (list, tuple)) or not choice:
                raise ValueError("structured outputs choice must be a non-empty list of strings")
            if any(not isinstance(c, str) for c in choice):
                raise ValueError("structured outputs choice must be a non-empty list of strings")
            self.choice = list(self.choice)
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError("structured outputs json must be a JSON schema: a dict or a string")
        if self.whitespace_pattern is not None:
            raise ValueError(
                "whitespace_pattern is an outlines option minivllm does not support; use "
                "disable_any_whitespace instead"
            )

    def kinds(self) -> list[str]:
        """The constraint kinds that are set (exactly one in a valid instance)."""
        names = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        return [n for n in names if getattr(self, n) not in (None, False)]

    @property
    def kind(self) -> str:
        """Which constraint this is: "json", "regex", "choice", "grammar", ..."""
        return self.kinds()[0]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutputsParams:
        """From a request body's ``structured_outputs`` object; unknown keys are an error."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown structured_outputs field(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**data)


@dataclass
class SamplingParams:
    """How to sample the completion(s) of one request (the fields of vLLM's class).

    Validation happens on construction; `verify_for_model` adds the checks that
    need the model (vocabulary size, logprobs cap).
    """

    n: int = 1
    """Number of completions to return for the prompt."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already generated; in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit per time it was generated; in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens seen in the prompt or the
    output; 1 disables, values > 1 discourage repeats. In [0.01, 100]."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax) decoding. In [0, 100]."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probabilities add up to top_p; in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 (or -1, accepted for compatibility) disables."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one; in [0, 1]."""
    seed: int | None = None
    """Seed of this request's own random generator, for reproducible sampling; in
    [-2**63, 2**64 - 1]. With n > 1, completion i uses ``seed + i``."""
    stop: str | list[str] | None = None
    """Strings that end generation when produced; they are not part of the output
    unless include_stop_str_in_output is set."""
    stop_token_ids: list[int] | None = None
    """Token ids that end generation; the token is part of the output ids."""
    ignore_eos: bool = False
    """Keep generating after the EOS token."""
    max_tokens: int | None = 16
    """Most tokens to generate per completion; None means up to the model's max length."""
    min_tokens: int = 0
    """Stop tokens (EOS, stop_token_ids) are masked out until this many are generated."""
    logprobs: int | None = None
    """Return this many top logprobs per generated token (plus the sampled token's);
    -1 returns the whole vocabulary."""
    prompt_logprobs: int | None = None
    """Like logprobs, for every prompt token."""
    detokenize: bool = True
    """Produce output text (stop strings need it)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the output text."""
    spaces_between_special_tokens: bool = True
    """Put spaces between special tokens in the output text."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the output text."""
    logit_bias: dict[int, float] | None = None
    """Added to the logits of the given token ids before sampling; values in [-100, 100]."""
    allowed_token_ids: list[int] | None = None
    """If set, only these token ids can be generated."""
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    """Whether streamed outputs are cumulative, deltas, or final only."""
    extra_args: dict[str, Any] | None = None
    """Free-form arguments for custom extensions; ignored by minivllm itself."""
    structured_outputs: StructuredOutputsParams | None = None
    """Constrain the output to a JSON schema, regex, choice or grammar."""
    thinking_token_budget: int | None = None
    """Most tokens a reasoning model may think: then its end-of-reasoning marker is
    forced and the answer follows.  None: no limit; needs a reasoning parser."""

    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    """stop_token_ids plus the model's EOS ids (filled by update_from_*)."""
    output_text_buffer_length: int = field(default=0, repr=False)
    """Characters held back while streaming so a stop string is never sent partially."""

    def __post_init__(self) -> None:
        if 0 < self.temperature < MIN_RANDOM_TEMPERATURE:
            logger.warning(
                "temperature %s is below %s and would overflow; using %s instead.",
                self.temperature,
                MIN_RANDOM_TEMPERATURE,
                MIN_RANDOM_TEMPERATURE,
            )
            self.temperature = MIN_RANDOM_TEMPERATURE
        if self.seed == -1:
            self.seed = None
        if self.top_k == -1:
            self.top_k = 0  # one spelling of "disabled" inside the engine
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        # OpenAI-style booleans: True asks for one logprob, False for none.
        if isinstance(self.logprobs, bool):
            self.logprobs = 1 if self.logprobs else None
        if isinstance(self.prompt_logprobs, bool):
            self.prompt_logprobs = 1 if self.prompt_logprobs else None
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.output_kind, int):
            self.output_kind = RequestOutputKind(self.output_kind)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)

        self._verify_args()

        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        if self.temperature < SAMPLING_EPS:
            # Greedy ignores the truncation knobs; resetting them keeps batches on the
            # cheap path (no top-k/top-p work for greedy rows).
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise ValueError(
                    f"n must be 1 with greedy sampling (temperature=0), got n={self.n}: "
                    "every completion would be identical. Use a temperature > 0."
                )
        self._all_stop_token_ids.update(self.stop_token_ids)

    def _verify_args(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}.")
        self._verify_floats()
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (or None), got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}.")
        budget = self.thinking_token_budget
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise ValueError(
                f"thinking_token_budget must be an int >= 0 (or None: no limit), got {budget!r}."
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})."
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < -1):
                raise ValueError(
                    f"{name} must be None, -1 (whole vocabulary) or >= 0, got {value!r}."
                )
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids or ()):
            raise ValueError(
                f"stop_token_ids must be non-negative ints, got {self.stop_token_ids}."
            )
        assert isinstance(self.stop, list)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True; set it or drop `stop`.")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty (None allows all).")
            if any(not isinstance(t, int) or t < 0 for t in self.allowed_token_ids):
                raise ValueError("allowed_token_ids must be non-negative ints.")
        self._verify_seed()

    def _verify_floats(self) -> None:
        """Every float knob finite and in a range the sampler computes safely in float32:
        an infinite temperature or bias turns a row's logits into NaN, and a NaN row
        would pick an arbitrary token past every constraint."""
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range(
            "repetition_penalty",
            self.repetition_penalty,
            MIN_REPETITION_PENALTY,
            MAX_REPETITION_PENALTY,
        )
        _check_range("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        if isinstance(self.top_p, bool) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or >= 1, got {self.top_k!r}.")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        for token_id, bias in (self.logit_bias or {}).items():
            if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias values must be finite numbers in [-{MAX_LOGIT_BIAS}, "
                    f"{MAX_LOGIT_BIAS}], got {bias!r} for token {token_id}."
                )

    def _verify_seed(self) -> None:
        seed = self.seed
        if seed is None:
            return
        if not isinstance(seed, int):
            raise ValueError(f"seed must be an int or None, got {seed!r}.")
        if not MIN_SEED <= seed <= MAX_SEED:
            raise ValueError(
                f"seed must be in [{MIN_SEED}, {MAX_SEED}] (a 64-bit value, what "
                f"torch.Generator takes), got {seed}."
            )
        # Completion i of an n > 1 request samples with seed + i (see LLMEngine.add_request).
        if seed + self.n - 1 > MAX_SEED:
            raise ValueError(
                f"seed {seed} with n={self.n} gives completion {self.n - 1} the seed "
                f"{seed + self.n - 1}, above the largest seed {MAX_SEED}; use a seed "
                f"<= {MAX_SEED - self.n + 1}."
            )

    def verify_for_model(self, vocab_size: int, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
        """Checks that need the model: token ids in range and the logprobs cap.

        ``max_logprobs`` is the model's cap (-1 means the whole vocabulary).
        """
        cap = vocab_size if max_logprobs == -1 else max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            wanted = vocab_size if value == -1 else value
            if wanted > cap:
                raise ValueError(
                    f"Requested {name}={value} ({wanted} logprobs) but at most {cap} are "
                    "allowed; lower it or raise the model's max_logprobs."
                )
        checks = {
            "allowed_token_ids": self.allowed_token_ids or (),
            "logit_bias": (self.logit_bias or {}).keys(),
        }
        for name, ids in checks.items():
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(
                    f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}."
                )

    def update_from_generation_config(
        self, generation_config: dict[str, Any], model_eos_token_id: int | None = None
    ) -> None:
        """Adopt the EOS ids of the model and of its generation config as stop tokens.

        Extra EOS ids from the generation config also go into ``stop_token_ids`` (unless
        ignore_eos) so that they appear in outputs as a stop reason, as in vLLM.
        """
        if model_eos_token_id is not None:
            self._all_stop_token_ids.add(model_eos_token_id)
        eos = generation_config.get("eos_token_id")
        if eos is None:
            return
        eos_ids = {eos} if isinstance(eos, int) else set(eos)
        eos_ids.discard(model_eos_token_id)  # type: ignore[arg-type]
        if eos_ids:
            self._all_stop_token_ids.update(eos_ids)
            if not self.ignore_eos:
                eos_ids.update(self.stop_token_ids or ())
                self.stop_token_ids = sorted(eos_ids)

    def update_from_tokenizer(self, eos_token_id: int | None) -> None:
        """Adopt the tokenizer's EOS id as a stop token (no-op for None)."""
        if eos_token_id is not None:
            self._all_stop_token_ids.add(eos_token_id)

    @property
    def all_stop_token_ids(self) -> set[int]:
        """Every token id that finishes the request (EOS included once known)."""
        return self._all_stop_token_ids

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    def clone(self) -> SamplingParams:
        """A deep copy (each request must own its mutable stop-token state).

        The constraint and extra_args are shared, not copied: nothing mutates them, and
        deepcopy recurses once per nesting level of a request's schema.
        """
        shared = (self.structured_outputs, self.extra_args)
        return copy.deepcopy(self, {id(v): v for v in shared if v is not None})

    def __repr__(self) -> str:
        # Only the fields that differ from the defaults keep logs short.
        defaults = _DEFAULTS
        shown = [
            f"{name}={getattr(self, name)!r}"
            for name in _PUBLIC_FIELDS
            if getattr(self, name) != defaults.get(name)
        ]
        return f"SamplingParams({', '.join(shown)})"


_PUBLIC_FIELDS = [name for name in SamplingParams.__dataclass_fields__ if not name.startswith("_")]
_PUBLIC_FIELDS.remove("output_text_buffer_length")
_DEFAULTS: dict[str, Any] = {name: getattr(SamplingParams(), name) for name in _PUBLIC_FIELDS}
