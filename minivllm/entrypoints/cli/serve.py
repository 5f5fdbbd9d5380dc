"""``minivllm serve [MODEL] [engine flags] [server flags]``: the OpenAI-compatible server.

With no MODEL it serves the bundled default model.  Every engine flag of
``minivllm config`` applies; the server flags are listed under "server" and
"server limits and CORS".
"""

from __future__ import annotations

import argparse
import json

from minivllm.entrypoints.cli.grouped_help import collapsed_group
from minivllm.entrypoints.lora_modules import parse_lora_module
from minivllm.entrypoints.model_tag import add_model_tag_argument
from minivllm.entrypoints.openai.responses.store import add_store_arguments, store_limits_of

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20
"""--max-request-body-bytes default (16 MiB); the API server's own default is the same."""
# The HTTP timeouts' defaults (entrypoints/openai/http_protocol.py has the same; the CLI
# does not import the server before it runs).
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The optional MODEL, the server flags and every engine flag."""
    from minivllm.args.engine_args import EngineArgs

    add_model_tag_argument(parser)
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="Interface to listen on (default: 127.0.0.1; use 0.0.0.0 for every interface).",
    )
    server.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    server.add_argument(
        "--api-key",
        default=None,
        help="If set, every request but /health, /version, /metrics and the API docs must "
        "send 'Authorization: Bearer <key>' (else 401).",
    )
    server.add_argument(
        "--max-log-len",
        type=int,
        default=None,
        help="With --enable-log-requests: most prompt characters and token ids shown per "
        "logged request (default: all).",
    )
    server.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="Log every request (prompt, parameters, prompt token ids) at INFO; off by "
        "default, since prompts are the users' data.",
    )
    server.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="Let requests pass their own chat_template (a Jinja template the server "
        "runs); without this flag such requests get a 400.",
    )
    server.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='Let the model decide when to call tools (tool_choice "auto", the default '
        "when a request has tools); needs --tool-call-parser.",
    )
    server.add_argument(
        "--tool-call-parser",
        choices=["hermes", "llama3_json"],
        default=None,
        help="How tool calls look in the model's text: hermes (<tool_call>{...}</tool_call>: "
        "Qwen, Hermes, SmolLM2 and other ChatML models) or llama3_json (Llama 3.x).",
    )
    server.add_argument(
        "--lora-modules",
        nargs="+",
        type=parse_lora_module,
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters to serve (needs --enable-lora), each name=path or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'; a request\'s model field '
        "selects one by name.",
    )
    server.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="Log level of uvicorn (the HTTP server).",
    )
    _add_limit_arguments(collapsed_group(parser, "server limits and CORS"))
    server.add_argument(
        "--api-server-count",
        "-asc",
        type=int,
        default=1,
        help="API server processes (vLLM's flag); minivllm runs one, in front of the "
        "engine replicas of -dp, which are processes of their own (default: 1).",
    )
    EngineArgs.add_cli_args(parser)
    _accept_several_served_names(parser)


def _add_limit_arguments(group: argparse._ArgumentGroup) -> None:
    """The server's HTTP limits, CORS and /v1/responses store: listed as a group in the
    short --help (--help="server limits and CORS" shows them)."""
    group.add_argument(
        "--allowed-origins",
        type=_string_list,
        default=["*"],
        help='CORS: origins allowed to call the API, a JSON list (default: ["*"]).',
    )
    group.add_argument(
        "--allowed-methods",
        type=_string_list,
        default=["*"],
        help='CORS: allowed methods, a JSON list (default: ["*"]).',
    )
    group.add_argument(
        "--allowed-headers",
        type=_string_list,
        default=["*"],
        help='CORS: allowed request headers, a JSON list (default: ["*"]).',
    )
    group.add_argument(
        "--allow-credentials",
        action="store_true",
        help="CORS: allow credentials (cookies, Authorization) in cross-origin requests.",
    )
    group.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body accepted, in bytes; larger ones get a 413 before they "
        f"are read (default: {DEFAULT_MAX_REQUEST_BODY_BYTES}, 16 MiB).",
    )
    group.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
        help="Seconds an idle keep-alive connection stays open "
        f"(default: {DEFAULT_TIMEOUT_KEEP_ALIVE_S}).",
    )
    group.add_argument(
        "--timeout-request-header",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="Seconds a client has to send a request's line and headers, from its first "
        "byte or the connection's opening; then 408 and the connection closes "
        f"(default: {DEFAULT_HEADER_TIMEOUT_S:g}).",
    )
    group.add_argument(
        "--timeout-request-body",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="Seconds a client has to send a whole request body after its headers; then "
        f"408 and the connection closes (default: {DEFAULT_BODY_TIMEOUT_S:g}).",
    )
    add_store_arguments(group)


def _string_list(value: str) -> list[str]:
    """A JSON list of strings (vLLM's form), or a comma-separated list."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(parsed, str):
        parsed = [parsed]
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {value!r}")
    return parsed


def _accept_several_served_names(parser: argparse.ArgumentParser) -> None:
    """``--served-model-name A B ...``, as in vLLM: the first name is the one responses
    report; every name is accepted as a request's ``model`` and listed by /v1/models."""
    for action in parser._actions:
        if "--served-model-name" in action.option_strings:
            action.nargs = "+"
            action.metavar = "NAME"


def run(args: argparse.Namespace) -> int:
    """Start the server; returns when it has shut down."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"argument --port: {args.port} is not a TCP port (0-65535)")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"argument --max-log-len: must be >= 0, got {args.max_log_len}")
    if args.max_request_body_bytes < 1:
        raise ValueError(
            f"argument --max-request-body-bytes: must be >= 1, got {args.max_request_body_bytes}"
        )
    for flag in ("timeout_keep_alive", "timeout_request_header", "timeout_request_body"):
        value = getattr(args, flag)
        if not value > 0 or value == float("inf"):
            name = "--" + flag.replace("_", "-")
            raise ValueError(f"argument {name}: must be a number of seconds > 0, got {value}")
    if args.api_server_count != 1:
        raise ValueError(
            f"argument --api-server-count: {args.api_server_count} API server processes are "
            "not supported by minivllm yet (one front end serves every -dp replica; the "
            "replicas are processes of their own); use 1, or start several servers with "
            "--data-parallel-rank behind a load balancer"
        )
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError(
            "argument --enable-auto-tool-choice: needs --tool-call-parser (hermes or llama3_json)"
        )
    store_limits_of(args)  # ValueError for a bad store limit, before the model loads
    from minivllm.entrypoints.openai.api_server import run_server

    return run_server(args)
