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

import argparse
import copy
import re
from typing import Any, ClassVar

from minivllm.args.fields import ArgSpec, ConfigTarget, build_specs, leaf_paths, with_config_fields
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.parsing import EXPLICIT_ATTR, PIECES_ATTR, add_field_argument, reduce_error
from minivllm.args.sizes import human_readable_int, human_readable_int_or_auto
from minivllm.config.cache import CacheConfig
from minivllm.config.device import DeviceConfig
from minivllm.config.load import LoadConfig
from minivllm.config.logging import LoggingConfig
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import ModelConfig
from minivllm.config.parallel import ParallelConfig
from minivllm.config.reasoning import ReasoningConfig
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
        "speculative_config",
        "kv_events_config",
        "kv_transfer_config",
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
    ConfigTarget(
        "logging_config",
        LoggingConfig,
        only=frozenset({"disable_log_stats", "log_stats_interval_s"}),
    ),
    # --reasoning-parser, --reasoning-start-str, --reasoning-end-str (vLLM's flag names).
    ConfigTarget("reasoning_config", ReasoningConfig),
    # Built only under enable_lora (vLLM's switch; see `EngineArgs.enable_lora`).
    ConfigTarget("lora_config", LoRAConfig),
    ConfigTarget("", VllmConfig, only=ROOT_FIELDS),
]
"""Which configs feed `EngineArgs`, in build order (a field two configs share belongs to
the first; the later one gets its resolved value, e.g. the model's ``max_model_len``)."""

ALIASES = {
    "optimization_level": ["-O"],
    "compilation_config": ["-cc"],
    "attention_config": ["-ac"],
    "data_parallel_size": ["-dp"],
    "tensor_parallel_size": ["-tp"],
    "pipeline_parallel_size": ["-pp"],
    "data_parallel_master_ip": ["--data-parallel-address"],
}
"""Short flags, as in vLLM."""

PARSERS = {
    "max_model_len": human_readable_int_or_auto,
    "max_num_batched_tokens": human_readable_int,
    "max_num_scheduled_tokens": human_readable_int,
    "kv_cache_memory_bytes": human_readable_int,
}
"""Integer flags that take sizes such as ``8k`` / ``8K`` (and ``auto``), the ones vLLM's do."""


_ENABLE_LORA_DOC = "Serve LoRA adapters (the other LoRA arguments apply only with it)."

SPECS, SHARED = build_specs(TARGETS)
"""The argument table, and per sub-config the fields it shares with an earlier one."""


@with_config_fields(SPECS)
class EngineArgs:
    """Arguments of one engine; fields mirror the config classes (see module docstring).

    Besides the fields, it offers `add_cli_args(parser)`, `from_cli_args(namespace)`,
    `create_engine_config() -> VllmConfig` and `user_set_paths()`.
    """

    _specs: ClassVar[tuple[ArgSpec, ...]]
    """The final argument table (set by `with_config_fields`)."""

    enable_prefix_caching: bool | None = None
    """Reuse KV blocks of identical prompt prefixes across requests. None (as in vLLM):
    decided per model when the config is built (on for every model minivllm runs)."""

    speculative_config: dict[str, Any] | None = None
    """Speculative decoding as a JSON object, e.g. ``{"method": "ngram",
    "num_speculative_tokens": 3}`` (see `SpeculativeConfig`); None: off."""

    kv_events_config: dict[str, Any] | None = None
    """KV cache event publishing as a JSON object, e.g. ``{"enable_kv_cache_events":
    true, "publisher": "zmq", "endpoint": "tcp://*:5557"}`` (see `KVEventsConfig`);
    None: off."""
    enable_lora: bool = False
    """Serve LoRA adapters (builds `LoRAConfig` from the LoRA arguments; without it
    they are ignored, as in vLLM)."""
    kv_transfer_config: dict[str, Any] | None = None
    """KV connector as a JSON object, e.g. ``{"kv_connector": "ExampleConnector",
    "kv_role": "kv_both"}`` (see `KVTransferConfig`); None: none."""

    def __post_init__(self) -> None:
        # A config-valued argument is always a config object, as in vLLM: None gives the
        # defaults, a dict its keys (kept, so the engine knows which the user set).
        self._nested_defaults: dict[str, Any] = {}
        self._nested_pieces: dict[str, dict[str, Any]] = {}
        self._cli_explicit: set[str] = set()
        """Argument names given as flags (see `from_cli_args`, `set_user_arg`)."""
        for spec in self._specs:
            value = getattr(self, spec.arg_name)
            if spec.nested_cls is None or not (value is None or isinstance(value, dict)):
                continue
            if value is None:
                value = self._nested_defaults[spec.arg_name] = spec.nested_cls()
            else:
                self._nested_pieces[spec.arg_name] = value
                value = self._build(spec.nested_cls, value, spec.path)
            setattr(self, spec.arg_name, value)

    # -- command line ---------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per engine argument, grouped by config class."""
        if isinstance(parser, FlexibleArgumentParser):
            parser.add_config_file_argument()
        groups: dict[str, Any] = {}
        for spec in cls._specs:
            key = spec.target.cls.__name__
            if key not in groups:
                doc = (spec.target.cls.__doc__ or "").strip().split("\n")[0]
                groups[key] = parser.add_argument_group(key, doc)
            add_field_argument(
                groups[key],
                [spec.flag, *ALIASES.get(spec.arg_name, [])],
                spec.arg_name,
                spec.field.annotation,
                spec.field.make_default(),
                spec.doc,
                PARSERS.get(spec.arg_name),
            )
        add_field_argument(
            groups["LoRAConfig"],
            ["--enable-lora"],
            "enable_lora",
            bool,
            False,
            _ENABLE_LORA_DOC,
            None,
        )
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """Engine arguments from a parsed namespace; remembers which flags were given."""
        kwargs: dict[str, Any] = {}
        # getattr: the namespace may come from a parser without some of these flags
        # (or without FlexibleArgumentParser's bookkeeping attributes).
        for spec in cls._specs:
            # None is what argparse holds for an absent JSON flag; the field default applies.
            value = getattr(args, spec.arg_name, None)
            if value is not None:
                kwargs[spec.arg_name] = value
        engine_args = cls(**kwargs, enable_lora=bool(getattr(args, "enable_lora", False)))
        names = {s.arg_name for s in cls._specs}
        explicit = set(getattr(args, EXPLICIT_ATTR, ()))
        engine_args._cli_explicit = explicit & names
        pieces = getattr(args, PIECES_ATTR, {})
        engine_args._nested_pieces.update({k: v for k, v in pieces.items() if k in names})
        return engine_args

    # -- user-set tracking ----------------------------------------------------
    def set_user_arg(self, name: str, value: Any) -> None:
        """Set argument ``name`` as if its flag had been given (e.g. a positional MODEL)."""
        if name not in {s.arg_name for s in self._specs}:
            raise ValueError(f"{type(self).__name__} has no argument {name!r}")
        setattr(self, name, value)
        self._cli_explicit = self._cli_explicit | {name}

    def user_set_args(self) -> set[str]:
        """Argument names given on the command line or changed from their defaults."""
        names = self._cli_explicit | set(self._nested_pieces)
        for spec in self._specs:
            value = getattr(self, spec.arg_name)
            if spec.nested_cls is not None:
                # A config object counts once it is not the default made in __post_init__.
                if value is not None and value is not self._nested_defaults.get(spec.arg_name):
                    names.add(spec.arg_name)
            elif value != spec.field.make_default():
                names.add(spec.arg_name)
        return names

    def user_set_paths(self) -> set[str]:
        """Config paths the user set, e.g. ``{"cache_config.block_size", "compilation_config.mode"}``."""
        by_name = {s.arg_name: s for s in self._specs}
        paths: set[str] = set()
        for name in self.user_set_args():
            spec = by_name[name]
            if spec.nested_cls is not None:
                if name in self._nested_pieces:
                    paths |= leaf_paths(spec.path, self._nested_pieces[name], spec.nested_cls)
                paths |= leaf_paths(spec.path, getattr(self, name), spec.nested_cls)
                continue
            paths.add(spec.path)
            for attr, pairs in SHARED.items():
                paths |= {f"{attr}.{name}" for name, owner in pairs if owner is spec}
        return paths

    # -- configs ----------------------------------------------------------------
    def _flag_for_path(self, path: str) -> str:
        """The flag that sets config ``path`` (``-cc.pass_config.x`` for nested keys)."""
        for spec in self._specs:
            if path == spec.path:
                return spec.flag
            if spec.nested_cls is not None and path.startswith(spec.path + "."):
                short = ALIASES.get(spec.arg_name, [spec.flag])[0]
                return f"{short}.{path[len(spec.path) + 1 :]}"
        return path

    def _mentioned_flag(self, message: str, prefix: str) -> str | None:
        """For an error without a location: the flag of a field the message names.

        Fields the user set are preferred; other fields of the failing config are
        considered only below the root, where the message is about that config.
        """

        def under(path: str) -> bool:
            return not prefix or path == prefix or path.startswith(prefix + ".")

        groups = [sorted(p for p in self.user_set_paths() if under(p))]
        if prefix:
            groups.append([s.path for s in self._specs if under(s.path)])
        for group in groups:
            hits = []
            for path in group:
                word = re.search(rf"\b{re.escape(path.rsplit('.', 1)[-1])}\b", message)
                if word is not None:
                    hits.append((word.start(), path))
            if hits:
                return self._flag_for_path(min(hits)[1])
        return None

    def _build(self, cls: type, kwargs: dict[str, Any], prefix: str) -> Any:
        """``cls(**kwargs)``; an error becomes one ValueError line naming the flag at fault."""
        try:
            return cls(**kwargs)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError

            def flag_for(loc: tuple[Any, ...]) -> str:
                parts = [prefix, *map(str, loc)] if prefix else [str(p) for p in loc]
                return self._flag_for_path(".".join(parts))

            message = reduce_error(exc, flag_for)
            errors = exc.errors() if callable(getattr(exc, "errors", None)) else []  # type: ignore[attr-defined]
            if not any(err.get("loc") for err in errors):
                flag = self._mentioned_flag(message, prefix)
                if flag is not None and not message.startswith(flag):
                    message = f"{flag}: {message}"
            raise ValueError(message) from None

    def _nested_value(self, spec: ArgSpec) -> Any:
        """A fresh config for the root: rebuilt from the user's keys when known (so it
        is resolved on the platform in force now), else a copy of the given object."""
        value = getattr(self, spec.arg_name)
        pieces = self._nested_pieces.get(spec.arg_name)
        if value is None or value is self._nested_defaults.get(spec.arg_name):
            pieces = {}
        if pieces is not None:
            return self._build(spec.nested_cls, pieces, spec.path)  # type: ignore[arg-type]
        if isinstance(value, dict):
            return self._build(spec.nested_cls, value, spec.path)  # type: ignore[arg-type]
        return copy.deepcopy(value)  # resolution must not change the caller's object

    def _check_data_parallel_rank(self) -> None:
        """``--data-parallel-rank`` means external load balancing (vLLM's rule): this
        server is that one replica, and it needs the address of rank 0."""
        given = self.user_set_args()
        if "data_parallel_rank" not in given:
            return
        if "data_parallel_master_ip" not in given:
            raise ValueError(
                "--data-parallel-rank: external load balancing needs --data-parallel-address "
                "(the address of data-parallel rank 0); add it, or drop --data-parallel-rank "
                "to let this server balance its own -dp replicas"
            )
        self.data_parallel_external_lb = True

    def create_engine_config(self) -> VllmConfig:
        """Build every sub-config, then the resolved `VllmConfig`, recording the paths the
        user set (raises ValueError naming the flag at fault)."""
        self._check_data_parallel_rank()
        _start_cpu_kernel_build(self.device)
        built: dict[str, Any] = {}
        for target in TARGETS:
            if not target.attr or (target.cls is LoRAConfig and not self.enable_lora):
                continue
            kwargs = {
                s.field.name: getattr(self, s.arg_name)
                for s in self._specs
                if s.target.attr == target.attr
            }
            for name, owner in SHARED.get(target.attr, []):
                kwargs[name] = getattr(built[owner.target.attr], owner.field.name)
            for name, (source, attribute) in target.derived.items():
                if hasattr(built.get(source), attribute):
                    kwargs[name] = getattr(built[source], attribute)
            if target.attr == "cache_config" and kwargs["enable_prefix_caching"] is None:
                # Unset (as in vLLM): decided per model.
                kwargs["enable_prefix_caching"] = built["model_config"].is_prefix_caching_supported
            built[target.attr] = self._build(target.cls, kwargs, target.attr)
        user_paths = self.user_set_paths()
        if not self.enable_lora:
            user_paths = {p for p in user_paths if not p.startswith("lora_config.")}
        given = self.user_set_args()
        for spec in self._specs:
            if spec.target.attr:
                continue
            if spec.nested_cls is None:
                built[spec.field.name] = getattr(self, spec.arg_name)
                continue
            nested = built[spec.field.name] = self._nested_value(spec)
            if spec.arg_name in given:
                # Whatever differs from the defaults came from the user's keys, including
                # fields an old spelling was translated into (``level`` -> ``mode``).
                user_paths |= leaf_paths(spec.path, nested, spec.nested_cls)
        built["user_set_paths"] = frozenset(user_paths)
        return self._build(VllmConfig, built, "")  # type: ignore[no-any-return]


__all__ = ["ALIASES", "PARSERS", "TARGETS", "EngineArgs", "FlexibleArgumentParser"]


def _start_cpu_kernel_build(device: str) -> None:
    """A CPU start-up on a machine without minivllm's C++ kernels compiles them while
    the config, tokenizer and weights are read (`lowbit_cpu.start_building`)."""
    if device.startswith("cuda") or (device == "auto" and _cuda_available()):
        return
    from minivllm.kernels import lowbit_cpu

    lowbit_cpu.start_building()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
