"""`EngineArgs`: every user-settable knob of the engine, from Python, flags, JSON or YAML.

`EngineArgs` has one field per user-settable field of the model, cache,
parallel, scheduler, device and load configs, plus the `VllmConfig` knobs
(optimization level, performance mode, the nested compilation config, ...).
The fields, their defaults, the flags and the help text are all derived from
the config classes, so a field added to a config is a flag at once::

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["-O3", "-cc.mode=3"]))
    vllm_config = args.create_engine_config()

Flag spellings (vLLM's): ``--block-size 16`` (or ``--block_size``),
``--enable-prefix-caching/--no-enable-prefix-caching``, ``--kv-cache-dtype``
(-> ``CacheConfig.cache_dtype``), ``--scheduling-policy`` (-> ``SchedulerConfig.policy``),
``-O0``..``-O3`` / ``-O 3`` / ``--optimization-level 3``,
``-cc '{"mode": 3}'``, ``-cc.mode=3``, ``-cc.pass_config.fuse_norm_quant=true``,
``--compilation-config.mode 3`` (pieces merge in order), and ``--config file.yaml``.
The config paths the user set go to `VllmConfig` so ``explain()`` can say "user".
"""

from __future__ import annotations

from typing import Any

from minivllm.args.fields import ConfigTarget, EngineArgsBase, engine_args_class
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.sizes import human_readable_int, human_readable_int_or_auto
from minivllm.config.cache import CacheConfig
from minivllm.config.device import DeviceConfig
from minivllm.config.load import LoadConfig
from minivllm.config.model import ModelConfig
from minivllm.config.parallel import ParallelConfig
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.vllm import VllmConfig

ROOT_FIELDS = frozenset(
    {
        "optimization_level",
        "performance_mode",
        "compilation_config",
        "attention_config",
        "kernel_config",
        "observability_config",
        "structured_outputs_config",
        "additional_config",
        "shutdown_timeout",
    }
)
"""`VllmConfig` fields that are engine arguments (the sub-configs below are built apart)."""

TARGETS = [
    ConfigTarget("model_config", ModelConfig),
    ConfigTarget(
        "cache_config",
        CacheConfig,
        renames={"cache_dtype": "kv_cache_dtype"},
        # Filled from the model (attention-free, sliding window), not chosen by users.
        exclude=frozenset({"is_attention_free", "sliding_window"}),
    ),
    # rank is per worker process and is_moe_model is copied from the model by VllmConfig.
    ConfigTarget("parallel_config", ParallelConfig, exclude=frozenset({"rank", "is_moe_model"})),
    ConfigTarget(
        "scheduler_config",
        SchedulerConfig,
        renames={"policy": "scheduling_policy"},
        derived={
            "is_encoder_decoder": ("model_config", "is_encoder_decoder"),
            "is_multimodal_model": ("model_config", "is_multimodal_model"),
        },
    ),
    ConfigTarget("device_config", DeviceConfig),
    # LoadConfig.device (None: the model's device) is not the --device of DeviceConfig.
    ConfigTarget("load_config", LoadConfig, exclude=frozenset({"device"})),
    ConfigTarget("", VllmConfig, only=ROOT_FIELDS),
]
"""Which configs feed `EngineArgs`, in build order (a field two configs share belongs to
the first; the later one gets its resolved value, e.g. the model's ``max_model_len``)."""

ALIASES = {
    "optimization_level": ["-O"],
    "compilation_config": ["-cc"],
    "attention_config": ["-ac"],
}
"""Short flags, as in vLLM."""

PARSERS = {
    "max_model_len": human_readable_int_or_auto,
    "max_num_batched_tokens": human_readable_int,
    "kv_cache_memory_bytes": human_readable_int,
}
"""Integer flags that take sizes such as ``8k`` / ``8K`` (and ``auto``), the ones vLLM's do."""


@engine_args_class(VllmConfig, TARGETS, aliases=ALIASES, parsers=PARSERS)
class EngineArgs(EngineArgsBase):
    """Arguments of one engine; fields mirror the config classes (see module docstring).

    Besides the fields, it offers `add_cli_args(parser)`, `from_cli_args(namespace)`,
    `create_engine_config() -> VllmConfig` and `user_set_paths()`.
    """

    enable_prefix_caching: bool | None = None
    """Reuse KV blocks of identical prompt prefixes across requests. None (as in vLLM):
    decided per model when the config is built (on for every model minivllm runs)."""

    def _resolve_unset(self, attr: str, kwargs: dict[str, Any], built: dict[str, Any]) -> None:
        if attr == "cache_config" and kwargs.get("enable_prefix_caching") is None:
            model = built["model_config"]
            kwargs["enable_prefix_caching"] = model.is_prefix_caching_supported

    def _build_root(self, kwargs: dict[str, Any], user_paths: set[str]) -> VllmConfig:
        return self._build(VllmConfig, {**kwargs, "user_set_paths": frozenset(user_paths)}, "")

    def create_engine_config(self) -> VllmConfig:
        """Build and resolve the `VllmConfig` (raises ValueError naming the flag at fault)."""
        return super().create_engine_config()  # type: ignore[no-any-return]


__all__ = ["ALIASES", "PARSERS", "TARGETS", "EngineArgs", "FlexibleArgumentParser"]
