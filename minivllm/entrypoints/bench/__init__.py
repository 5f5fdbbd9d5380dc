"""``minivllm bench``: throughput, latency, serving and start-up benchmarks (as ``vllm bench``).

Sub-commands live in sibling modules (`throughput`, `latency`, `serve`, `startup`); each
provides ``add_cli_args(parser)`` and ``main(args) -> dict`` (the figures it also writes
with ``--output-json``).  `cli` wires them under ``minivllm bench``.
"""
