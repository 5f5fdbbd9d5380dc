"""Sampling flags shared by ``minivllm generate`` and ``minivllm chat``.

``add_sampling_args(parser)`` registers ``--max-tokens --temperature --top-p --top-k
--min-p --repetition-penalty --n --stop --ignore-eos`` (and ``--seed`` when the engine
flags have not already claimed it), and ``sampling_params_from_args(args)`` turns the
parsed values into a validated `SamplingParams`.  An invalid value raises a
`ValueError` naming the flag, which the CLI prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from minivllm.args.parsing import EXPLICIT_ATTR
from minivllm.sampling_params import SamplingParams

_OWNS_SEED = "_sampling_owns_seed"
"""Namespace attribute: True when --seed was registered here rather than by EngineArgs."""

# SamplingParams field -> flag, for naming the flag in validation errors.
_FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "n": "--n",
    "seed": "--seed",
    "stop": "--stop",
}


def add_sampling_args(
    parser: argparse.ArgumentParser, default_max_tokens: int = 16
) -> argparse.ArgumentParser:
    """Register the sampling flags; call it after `EngineArgs.add_cli_args`.

    The engine already has a ``--seed`` (the model config's seed); argparse cannot hold
    two, so then that one flag serves both, and an explicit ``--seed`` also seeds each
    request's sampler.
    """
    group = parser.add_argument_group("sampling", "How each completion is sampled.")
    group.add_argument(
        "--max-tokens",
        type=int,
        default=default_max_tokens,
        help=f"Most tokens to generate per completion (default: {default_max_tokens}).",
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Softmax temperature; 0 means greedy decoding (default: 1.0).",
    )
    group.add_argument(
        "--top-p", type=float, default=1.0, help="Nucleus sampling mass in (0, 1] (default: 1.0)."
    )
    group.add_argument(
        "--top-k",
        type=int,
        default=0,
        help="Keep only the k most likely tokens; 0 or -1 disables (default: 0).",
    )
    group.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="Drop tokens less likely than min-p times the best one (default: 0).",
    )
    group.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="Penalize tokens already seen; 1 disables (default: 1.0).",
    )
    group.add_argument(
        "--n",
        type=int,
        default=1,
        help="Completions per prompt (default: 1; needs temperature > 0).",
    )
    group.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="Stop generating when TEXT appears (repeat the flag for several stop strings).",
    )
    group.add_argument(
        "--ignore-eos", action="store_true", help="Keep generating after the end-of-text token."
    )
    if "--seed" not in parser._option_string_actions:
        group.add_argument("--seed", type=int, default=None, help="Seed of each request's sampler.")
        parser.set_defaults(**{_OWNS_SEED: True})
    return parser


def _sampling_seed(args: argparse.Namespace) -> int | None:
    """The per-request seed: only a --seed the user gave (the engine's default is 0)."""
    if getattr(args, _OWNS_SEED, False):
        return args.seed  # type: ignore[no-any-return]
    explicit = getattr(args, EXPLICIT_ATTR, ())
    return args.seed if "seed" in explicit else None


def _flag_of(message: str) -> str | None:
    """The flag a SamplingParams message is about (messages start with the field name)."""
    first = message.split(" ", 1)[0]
    return _FLAGS.get(first)


def sampling_params_from_args(args: argparse.Namespace, **overrides: Any) -> SamplingParams:
    """A validated `SamplingParams` from the parsed flags (``overrides`` win).

    Raises ValueError as ``argument --FLAG: reason`` for an out-of-range value.
    """
    kwargs: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "n": args.n,
        "seed": _sampling_seed(args),
        "stop": list(args.stop or []),
        "ignore_eos": args.ignore_eos,
    }
    kwargs.update(overrides)
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        message = str(exc)
        flag = _flag_of(message)
        raise ValueError(f"argument {flag}: {message}" if flag else message) from None
