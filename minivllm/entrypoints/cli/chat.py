"""``minivllm chat [engine flags] [sampling flags] [--system TEXT]``: talk to the model.

Each line read from stdin is a user turn.  The whole conversation is rendered
with the model's chat template and the assistant's reply is written token by
token as the engine produces it (DELTA outputs), then kept in the history.
``/exit`` or end of input ends the session; ``/reset`` forgets the history.
Works with a pipe as stdin (no prompt is shown then), so scripts and tests can
drive it.  A turn that cannot be served (the conversation outgrew the context)
is reported on stderr and dropped; the session goes on.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from minivllm.entrypoints.cli.sampling_args import add_sampling_args, sampling_params_from_args

if TYPE_CHECKING:
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.sampling_params import SamplingParams

DEFAULT_MAX_TOKENS = 256
"""--max-tokens of a reply when not given."""

EXIT_COMMANDS = frozenset({"/exit", "/quit"})
"""Lines that end the session."""

RESET_COMMAND = "/reset"
"""A line that clears the conversation (the system prompt stays)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--system, --chat-template, the engine flags and the sampling flags."""
    from minivllm.args.engine_args import EngineArgs

    parser.add_argument(
        "--system", metavar="TEXT", default=None, help="A system message opening the chat."
    )
    parser.add_argument(
        "--chat-template",
        metavar="JINJA",
        default=None,
        help="A Jinja chat template (text) to use instead of the model's own.",
    )
    EngineArgs.add_cli_args(parser)
    add_sampling_args(parser, default_max_tokens=DEFAULT_MAX_TOKENS)


class ChatSession:
    """A conversation with one engine: history plus the reply loop."""

    def __init__(
        self,
        engine: LLMEngine,
        params: SamplingParams,
        system: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.system = system
        self.chat_template = chat_template
        self.messages: list[dict[str, str]] = []
        self.reset()
        self._turn = 0

    def reset(self) -> None:
        """Forget every turn; keep the system message."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, user_text: str, out: TextIO) -> str:
        """Stream the assistant's answer to ``user_text`` into ``out``; returns it.

        On ValueError (nothing written yet) or an interrupt the turn is dropped.
        """
        from minivllm.tokenizer import apply_chat_template

        messages = [*self.messages, {"role": "user", "content": user_text}]
        prompt_ids = apply_chat_template(
            self.engine.get_tokenizer(),
            messages,
            add_generation_prompt=True,
            tokenize=True,
            chat_template=self.chat_template,
        )
        params = self.params.clone()
        room = self.engine.model_config.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"the conversation ({len(prompt_ids)} tokens) fills the model's context; "
                f"type {RESET_COMMAND} to start over"
            )
        if params.max_tokens is None or params.max_tokens > room:
            params.max_tokens = room  # a long chat shortens the reply instead of failing
        request_id = f"chat-{self._turn}"
        self._turn += 1
        self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params)
        pieces: list[str] = []
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    for completion in output.outputs:
                        if completion.text:
                            out.write(completion.text)
                            out.flush()
                            pieces.append(completion.text)
        except BaseException:
            self.engine.abort_request(request_id)
            raise
        text = "".join(pieces)
        self.messages = [*messages, {"role": "assistant", "content": text}]
        return text


def run_session(session: ChatSession, stdin: TextIO, out: TextIO, err: TextIO) -> None:
    """Read turns until EOF or /exit."""
    interactive = stdin.isatty()
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = stdin.readline()
        if not line:  # EOF
            if interactive:
                out.write("\n")
            return
        text = line.rstrip("\r\n")
        command = text.strip()
        if command in EXIT_COMMANDS:
            return
        if command == RESET_COMMAND:
            session.reset()
            continue
        if not command:
            continue
        try:
            session.reply(text, out)
        except ValueError as exc:
            err.write(f"error: {' '.join(str(exc).split())}\n")
            err.flush()
            continue
        except KeyboardInterrupt:
            if not interactive:
                raise
            out.write("\n[interrupted]")  # back to the prompt; the turn is dropped
        out.write("\n")
        out.flush()


NO_INPUT = (
    "minivllm chat: no input: stdin ended before any message (pipe user turns, one per "
    "line, or run it in a terminal); the model was not loaded"
)


class _Replayed:
    """A piped stdin whose first lines were already read (to see that it has input)."""

    def __init__(self, head: list[str], rest: TextIO) -> None:
        self._head = head
        self._rest = rest

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        return self._head.pop(0) if self._head else self._rest.readline()


def first_message(stdin: TextIO) -> TextIO | None:
    """A piped stdin, replayed from its start, if it holds a message before EOF; None if
    it holds none (so the model is not loaded for nothing).  A terminal is returned as is."""
    if stdin.isatty():
        return stdin
    head: list[str] = []
    while True:
        line = stdin.readline()
        if not line:
            return None
        head.append(line)
        if line.strip():
            return _Replayed(head, stdin)


def run(args: argparse.Namespace) -> int:
    """Check the flags, start the engine, chat until EOF or /exit."""
    from minivllm.sampling_params import RequestOutputKind

    params = sampling_params_from_args(args, output_kind=RequestOutputKind.DELTA)
    if params.n != 1:
        raise ValueError(f"argument --n: chat streams one reply per turn; got --n {params.n}")
    stdin = first_message(sys.stdin)
    if stdin is None:
        print(NO_INPUT, file=sys.stderr)
        return 0

    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    if args.chat_template is None and not getattr(engine.get_tokenizer(), "chat_template", None):
        raise ValueError(
            "this model's tokenizer has no chat template; pass one with --chat-template, "
            "or use `minivllm generate` for plain completion"
        )
    session = ChatSession(engine, params, system=args.system, chat_template=args.chat_template)
    run_session(session, stdin, sys.stdout, sys.stderr)
    return 0
