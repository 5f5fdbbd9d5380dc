"""vLLM's import path for engine arguments (``from vllm.engine.arg_utils import
EngineArgs``), kept so that switching is a change of package name; minivllm's own
code imports `minivllm.args`."""

from minivllm.args.engine_args import EngineArgs
from minivllm.args.parser import FlexibleArgumentParser

__all__ = ["EngineArgs", "FlexibleArgumentParser"]
