"""``python -m minivllm.entrypoints.cli ...`` runs the ``minivllm`` command."""

from minivllm.entrypoints.cli.main import main

if __name__ == "__main__":
    main()
