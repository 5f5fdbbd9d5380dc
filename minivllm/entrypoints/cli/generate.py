"""``minivllm generate PROMPT... [engine flags] [sampling flags] [--stream]``.

Runs every prompt through one engine as a batch and prints the completions in
prompt order.  With one prompt and ``--n 1`` only the completion text is printed
(handy in scripts); otherwise each completion follows a ``=== prompt I/N ... ===``
header.  ``--stream`` writes tokens as they are generated: the first completion
streams live while the others, computed in the same batches, are buffered and
flushed as soon as their turn comes, so the output is the same as without it.
Without PROMPT arguments the prompts are read from stdin, one per line.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from minivllm.entrypoints.cli.sampling_args import add_sampling_args, sampling_params_from_args

if TYPE_CHECKING:
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.sampling_params import SamplingParams

DEFAULT_MAX_TOKENS = 64
"""--max-tokens when not given: long enough to read, short enough to be quick."""

_HEADER_PROMPT_CHARS = 60
"""Prompts longer than this are cut in the headers."""

Key = tuple[str, int]
"""(request id, completion index) of one completion."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prompts, --stream, the engine flags and the sampling flags."""
    from minivllm.args.engine_args import EngineArgs

    parser.add_argument(
        "prompts",
        nargs="*",
        metavar="PROMPT",
        help="Prompts to complete, next to each other on the command line (use -- before "
        "a prompt that starts with '-'); none: read one prompt per line from stdin.",
    )
    parser.add_argument(
        "--stream", action="store_true", help="Print tokens as soon as they are generated."
    )
    EngineArgs.add_cli_args(parser)
    add_sampling_args(parser, default_max_tokens=DEFAULT_MAX_TOKENS)


def read_prompts(args: argparse.Namespace, stdin: TextIO) -> list[str]:
    """The PROMPT arguments, or the non-empty lines of a piped stdin."""
    if args.prompts:
        return list(args.prompts)
    if stdin.isatty():
        raise ValueError("give at least one PROMPT, or pipe prompts on stdin (one per line)")
    prompts = [line.rstrip("\r\n") for line in stdin]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise ValueError("stdin held no prompts; give at least one PROMPT")
    return prompts


class OrderedWriter:
    """Writes completions in a fixed order while the engine produces them out of order.

    Text of the current completion is written at once when streaming; text of later
    ones is buffered until every completion before them has finished.
    """

    def __init__(self, out: TextIO, keys: list[Key], headers: dict[Key, str], stream: bool) -> None:
        self.out = out
        self.keys = keys
        self.headers = headers
        self.stream = stream
        self.buffers: dict[Key, list[str]] = {k: [] for k in keys}
        self.finished: set[Key] = set()
        self.cursor = 0
        self._started = False

    def add(self, key: Key, text: str, finished: bool) -> None:
        """Take one delta of completion ``key``; write whatever may be written now."""
        self.buffers[key].append(text)
        if finished:
            self.finished.add(key)
        self._drain()

    def _drain(self) -> None:
        while self.cursor < len(self.keys):
            key = self.keys[self.cursor]
            done = key in self.finished
            if not (done or self.stream):
                return
            if not self._started:
                if key in self.headers:
                    self.out.write(self.headers[key] + "\n")
                self._started = True
            self.out.write("".join(self.buffers[key]))
            self.buffers[key].clear()
            if not done:
                self.out.flush()
                return
            self.out.write("\n")
            self.out.flush()
            self.cursor += 1
            self._started = False

    @property
    def done(self) -> bool:
        return self.cursor == len(self.keys)


def make_headers(prompts: list[str], request_ids: list[str], n: int) -> dict[Key, str]:
    """Header lines, or none when a single completion is printed bare."""
    if len(prompts) == 1 and n == 1:
        return {}
    headers = {}
    for i, (prompt, rid) in enumerate(zip(prompts, request_ids, strict=True)):
        shown = (
            prompt if len(prompt) <= _HEADER_PROMPT_CHARS else prompt[:_HEADER_PROMPT_CHARS] + "..."
        )
        for j in range(n):
            which = f" completion {j + 1}/{n}" if n > 1 else ""
            headers[(rid, j)] = f"=== prompt {i + 1}/{len(prompts)}{which}: {shown!r} ==="
    return headers


def generate(
    engine: LLMEngine,
    prompts: list[str],
    params: SamplingParams,
    writer_out: TextIO,
    stream: bool,
) -> None:
    """Run ``prompts`` on ``engine`` (params must ask for DELTA outputs) and write them."""
    request_ids: list[str] = []
    try:
        for i, prompt in enumerate(prompts):
            request_ids.append(engine.add_request(f"generate-{i}", prompt, params))
        keys = [(rid, j) for rid in request_ids for j in range(params.n)]
        writer = OrderedWriter(
            writer_out, keys, make_headers(prompts, request_ids, params.n), stream
        )
        while engine.has_unfinished_requests():
            for output in engine.step():
                for completion in output.outputs:
                    writer.add(
                        (output.request_id, completion.index),
                        completion.text,
                        completion.finish_reason is not None,
                    )
        assert writer.done, "the engine finished without finishing every completion"
    except BaseException:
        if request_ids:
            engine.abort_request(request_ids)
        raise


def run(args: argparse.Namespace) -> int:
    """Check the flags, start the engine, generate and print."""
    from minivllm.sampling_params import RequestOutputKind

    # Sampling flags and prompts are checked before the (slow) engine start.
    params = sampling_params_from_args(args, output_kind=RequestOutputKind.DELTA)
    prompts = read_prompts(args, sys.stdin)

    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    generate(engine, prompts, params, sys.stdout, args.stream)
    return 0
