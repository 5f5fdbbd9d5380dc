"""The ``minivllm`` command: ``serve``, ``generate``, ``chat``, ``config`` and ``bench``.

`main` parses the subcommand and hands over to its module (`serve`, `generate`,
`chat`, `config`; ``bench`` lives in `minivllm.entrypoints.bench`).  Engine flags
come from `EngineArgs`, so every subcommand that builds an engine takes them all.
"""
