"""Benchmark requests: the ``random`` and ``sharegpt`` datasets (as in ``vllm bench``).

``random`` makes prompts of an exact number of tokens: random token ids are decoded
to text, and the text is re-tokenized until decoding and encoding agree, so the text
prompt (what a server receives) and the token ids (what the offline engine receives)
are both exactly the requested length under the benchmark's tokenizer.

``sharegpt`` reads a ShareGPT-format JSON file: a list of
``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}``.
The first human turn is the prompt; the gpt turn after it gives the output length
(unless ``--output-len`` fixes it).  Too short and too long pairs are skipped, with
vLLM's limits.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minivllm.logger import init_logger

logger = init_logger(__name__)

DEFAULT_INPUT_LEN = 128
"""--input-len of the random dataset when not given (vLLM's 1024 is slow on a CPU)."""
DEFAULT_OUTPUT_LEN = 128
"""--output-len of the random dataset when not given."""
SHAREGPT_MIN_LEN = 4
"""ShareGPT pairs whose prompt or reply is shorter than this many tokens are skipped."""
SHAREGPT_MAX_PROMPT_LEN = 1024
"""ShareGPT prompts longer than this many tokens are skipped."""
SHAREGPT_MAX_TOTAL_LEN = 2048
"""ShareGPT pairs whose prompt + output exceed this many tokens are skipped."""
MAX_ROUND_TRIPS = 16
"""Decode/encode rounds tried before a random prompt is restarted from fresh ids."""

_HUMAN_ROLES = ("human", "user")
_GPT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "bing")


@dataclass
class SampleRequest:
    """One benchmark request: its prompt as text and as token ids, and its output length."""

    prompt: str
    prompt_token_ids: list[int]
    """``tokenizer(prompt).input_ids``: what the engine sees for the text prompt."""
    expected_output_len: int
    """Tokens to generate (sent as max_tokens)."""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def add_dataset_args(parser: argparse.ArgumentParser, *, with_range: bool = True) -> None:
    """--dataset, --dataset-path, --input-len, --output-len, --range-ratio, --num-prompts."""
    group = parser.add_argument_group("dataset")
    group.add_argument(
        "--dataset",
        "--dataset-name",
        dest="dataset",
        choices=["random", "sharegpt"],
        default="random",
        help="Where prompts come from (default: random token prompts).",
    )
    group.add_argument(
        "--dataset-path",
        default=None,
        metavar="FILE",
        help="ShareGPT-format JSON file (required with --dataset sharegpt).",
    )
    group.add_argument(
        "--input-len",
        "--random-input-len",
        dest="input_len",
        type=int,
        default=None,
        help=f"Prompt length in tokens of the random dataset (default {DEFAULT_INPUT_LEN}).",
    )
    group.add_argument(
        "--output-len",
        "--random-output-len",
        dest="output_len",
        type=int,
        default=None,
        help=f"Tokens to generate per request (random default {DEFAULT_OUTPUT_LEN}; "
        "sharegpt default: the length of the dataset's reply).",
    )
    if with_range:
        group.add_argument(
            "--range-ratio",
            "--random-range-ratio",
            dest="range_ratio",
            type=float,
            default=0.0,
            help="Random lengths are drawn uniformly from [len*(1-r), len*(1+r)]; 0 = exact.",
        )
    group.add_argument(
        "--num-prompts", type=int, default=100, help="Number of requests (default 100)."
    )


def _allowed_token_ids(tokenizer: Any) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def _num_special_tokens(tokenizer: Any) -> int:
    """Tokens the tokenizer adds around any text (a BOS, say)."""
    return len(tokenizer("").input_ids)


def exact_length_prompt(
    tokenizer: Any, length: int, rng: random.Random, allowed_ids: list[int] | None = None
) -> tuple[str, list[int]]:
    """A text whose tokenization is exactly ``length`` tokens, and those token ids.

    The count includes the special tokens the tokenizer adds (what a server counts).
    """
    if allowed_ids is None:
        allowed_ids = _allowed_token_ids(tokenizer)
    body_len = length - _num_special_tokens(tokenizer)
    if body_len < 1:
        raise ValueError(
            f"an input length of {length} tokens leaves no room for text after the "
            "tokenizer's special tokens; use a larger --input-len"
        )
    for _ in range(8):
        ids = rng.choices(allowed_ids, k=body_len)
        for _ in range(MAX_ROUND_TRIPS):
            text = tokenizer.decode(ids)
            again = tokenizer(text, add_special_tokens=False).input_ids
            if again == ids:
                full = tokenizer(text).input_ids
                assert len(full) == length, "special tokens changed the length"
                return text, full
            # Merges across token borders change the ids; keep the re-tokenized ones
            # (cut or topped up) and try again: this settles within a round or two.
            ids = again[:body_len] + rng.choices(allowed_ids, k=max(0, body_len - len(again)))
    raise RuntimeError(f"could not build a prompt of exactly {length} tokens")


def sample_random(
    tokenizer: Any,
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[SampleRequest]:
    """``num_requests`` prompts of ``input_len`` tokens (+- range_ratio), seeded."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"argument --range-ratio: must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError(
            f"--input-len and --output-len must be >= 1, got {input_len} and {output_len}"
        )
    rng = random.Random(seed)
    allowed = _allowed_token_ids(tokenizer)

    def draw(center: int) -> int:
        lo = max(1, int(center * (1 - range_ratio)))
        hi = max(lo, int(center * (1 + range_ratio)))
        return rng.randint(lo, hi)

    requests = []
    for _ in range(num_requests):
        in_len, out_len = draw(input_len), draw(output_len)
        text, ids = exact_length_prompt(tokenizer, in_len, rng, allowed)
        requests.append(SampleRequest(text, ids, out_len))
    return requests


def _first_exchange(entry: Any) -> tuple[str, str] | None:
    """(first human turn, the gpt turn after it) of one ShareGPT entry, if it has both."""
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    for i, turn in enumerate(turns):
        if isinstance(turn, dict) and turn.get("from") in _HUMAN_ROLES:
            for reply in turns[i + 1 :]:
                if isinstance(reply, dict) and reply.get("from") in _GPT_ROLES:
                    return str(turn.get("value", "")), str(reply.get("value", ""))
            return None
    return None


def load_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """The (prompt, reply) pairs of a ShareGPT-format JSON file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"argument --dataset-path: {str(file)!r} is not a file")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"argument --dataset-path: {str(file)!r} is not JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(
            f"argument --dataset-path: {str(file)!r} must hold a JSON list of "
            '{"conversations": [...]} entries (ShareGPT format)'
        )
    return [pair for pair in map(_first_exchange, data) if pair is not None]


def sample_sharegpt(
    tokenizer: Any,
    path: str | Path,
    num_requests: int,
    output_len: int | None = None,
    seed: int = 0,
) -> list[SampleRequest]:
    """Up to ``num_requests`` requests from a ShareGPT file, shuffled with ``seed``.

    When fewer valid pairs exist, pairs are repeated (chosen at random) to reach the
    count, as vLLM does.
    """
    pairs = load_sharegpt(path)
    rng = random.Random(seed)
    rng.shuffle(pairs)
    requests: list[SampleRequest] = []
    for prompt, reply in pairs:
        if len(requests) == num_requests:
            break
        ids = tokenizer(prompt).input_ids
        reply_len = len(tokenizer(reply, add_special_tokens=False).input_ids)
        out_len = output_len if output_len is not None else reply_len
        if len(ids) < SHAREGPT_MIN_LEN or (output_len is None and out_len < SHAREGPT_MIN_LEN):
            continue
        if len(ids) > SHAREGPT_MAX_PROMPT_LEN or len(ids) + out_len > SHAREGPT_MAX_TOTAL_LEN:
            continue
        requests.append(SampleRequest(prompt, ids, out_len))
    if not requests:
        raise ValueError(
            f"argument --dataset-path: no usable conversation in {str(path)!r} (each needs a "
            f"human turn followed by a gpt turn, both >= {SHAREGPT_MIN_LEN} tokens, prompt <= "
            f"{SHAREGPT_MAX_PROMPT_LEN} tokens)"
        )
    if len(requests) < num_requests:
        logger.info(
            "%s has %d usable conversations; repeating some to make %d requests",
            path,
            len(requests),
            num_requests,
        )
        requests += [rng.choice(requests) for _ in range(num_requests - len(requests))]
    return requests


def get_samples(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest]:
    """The requests the dataset flags in ``args`` describe."""
    # The engine's --seed may be absent from the namespace (None): seed 0 then.
    seed = getattr(args, "seed", None) or 0
    if args.num_prompts < 1:
        raise ValueError(f"argument --num-prompts: must be >= 1, got {args.num_prompts}")
    if args.dataset == "sharegpt":
        if args.dataset_path is None:
            raise ValueError("--dataset sharegpt needs --dataset-path FILE (a ShareGPT JSON file)")
        if args.output_len is not None and args.output_len < 1:
            raise ValueError(f"argument --output-len: must be >= 1, got {args.output_len}")
        return sample_sharegpt(
            tokenizer, args.dataset_path, args.num_prompts, args.output_len, seed
        )
    if args.dataset_path is not None:
        raise ValueError("--dataset-path is read only with --dataset sharegpt")
    return sample_random(
        tokenizer,
        args.num_prompts,
        args.input_len if args.input_len is not None else DEFAULT_INPUT_LEN,
        args.output_len if args.output_len is not None else DEFAULT_OUTPUT_LEN,
        getattr(args, "range_ratio", 0.0),
        seed,
    )
