"""Engine arguments: flags/JSON/YAML -> configs, precedence, and user-set tracking.

Everything runs on the real `EngineArgs` and `VllmConfig`: the field table comes
from the config classes, so these tests follow them as they grow.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.args.engine_args import EngineArgs
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.args.parsing import deep_merge
from minivllm.config.cache import CacheConfig
from minivllm.config.compilation.config import CompilationConfig
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
from minivllm.config.optimization import OptimizationLevel
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.utils import field_docs


def parse(argv: list[str]) -> EngineArgs:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="t"))
    return EngineArgs.from_cli_args(parser.parse_args(argv))


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # exactly one line
    return err


def user_sources(cfg: Any) -> set[str]:
    """The config paths `explain()` attributes to the user."""
    return {path for path, row in cfg.explain().items() if row["source"] == "user"}


def one_line(text: str) -> str:
    return " ".join(text.split())  # undo argparse's (and docstrings') line wrapping


# ----------------------------------------------------------------------------
# The field table, flags and values
# ----------------------------------------------------------------------------
def test_fields_derived_from_configs_with_renames_and_defaults() -> None:
    args = EngineArgs()
    assert args.gpu_memory_utilization == CacheConfig().gpu_memory_utilization
    assert args.kv_cache_dtype == "auto" and not hasattr(args, "cache_dtype")
    assert args.scheduling_policy == "fcfs" and not hasattr(args, "policy")
    # a default_factory list is fresh per instance
    assert args.ignore_patterns == ["original/**/*"]
    assert args.ignore_patterns is not EngineArgs().ignore_patterns
    assert args.optimization_level is OptimizationLevel.O2
    assert args.prefix_cache_retention_interval == 0  # vLLM's field and default
    # a shared field is one argument, owned by the first config (the model's)
    names = [s.arg_name for s in EngineArgs._specs]
    assert names.count("max_model_len") == 1
    assert next(s for s in EngineArgs._specs if s.arg_name == "max_model_len").path == (
        "model_config.max_model_len"
    )
    # one class, no generic base: its methods are its own
    assert EngineArgs.__mro__ == (EngineArgs, object)


def test_help_comes_from_field_docstrings() -> None:
    help_text = one_line(EngineArgs.add_cli_args(FlexibleArgumentParser(prog="t")).format_help())
    doc = one_line(field_docs(CacheConfig)["gpu_memory_utilization"])
    assert f"{doc} (default: 0.9)" in help_text
    assert one_line(field_docs(SchedulerConfig)["long_prefill_token_threshold"])[:60] in help_text
    assert "4% of max_model_len" in help_text  # '%' survives argparse formatting
    assert "--enable-prefix-caching, --no-enable-prefix-caching" in help_text
    assert "--optimization-level {0,1,2,3}, -O {0,1,2,3}" in help_text


def test_scalar_flags_map_to_config_fields() -> None:
    args = parse(
        "--block-size 32 --gpu-memory-utilization 0.5 --kv-cache-dtype fp8 --max-num-seqs 4 "
        "--enforce-eager --no-enable-prefix-caching --scheduling-policy priority "
        "--max_model_len 1024 --ignore-patterns a b --performance-mode throughput".split()
    )
    cfg = args.create_engine_config()
    assert cfg.cache_config.block_size == 32
    assert cfg.cache_config.gpu_memory_utilization == 0.5
    assert cfg.cache_config.cache_dtype == "fp8"
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.model_config.enforce_eager is True
    assert cfg.scheduler_config.max_num_seqs == 4 and cfg.scheduler_config.policy == "priority"
    assert cfg.load_config.ignore_patterns == ["a", "b"]
    # the scheduler receives the model config's value of the shared field
    assert cfg.model_config.max_model_len == cfg.scheduler_config.max_model_len == 1024
    assert cfg.performance_mode == "throughput"


@pytest.mark.parametrize(
    "argv", [["-O0"], ["-O", "0"], ["--optimization-level", "0"], ["-O=O0"], ["-Oo0"]]
)
def test_optimization_level_spellings(argv: list[str]) -> None:
    assert parse(argv).optimization_level is OptimizationLevel.O0


def test_compilation_config_forms_merge_in_order() -> None:
    args = parse(
        [
            "-cc",
            '{"mode": 1, "backend": "eager", "pass_config": {"fuse_norm_quant": false}}',
            "-cc.mode=3",
            "--compilation-config.cudagraph_capture_sizes",
            "[1, 2, 4]",
            "-cc.pass_config.fuse_norm_quant=true",
            "--compilation_config.backend=inductor",
            "-cc.cudagraph_mode=1",
        ]
    )
    # The pieces merge in order into one config object (vLLM's parsed value).
    compilation_config = args.compilation_config
    assert isinstance(compilation_config, CompilationConfig)
    assert (
        compilation_config.mode is CompilationMode.VLLM_COMPILE
        and compilation_config.backend == "inductor"
    )
    assert compilation_config.cudagraph_capture_sizes == [1, 2, 4]
    assert compilation_config.pass_config.fuse_norm_quant is True
    assert compilation_config.cudagraph_mode is CUDAGraphMode.PIECEWISE


def test_later_json_merges_over_earlier_dotted() -> None:
    merged = parse(["-cc.mode=3", "-cc.backend=eager", "--compilation-config", '{"mode": 0}'])
    assert merged.compilation_config.mode is CompilationMode.NONE
    assert merged.compilation_config.backend == "eager"


def test_user_set_paths() -> None:
    args = parse(
        ["--block-size", "16", "-O1", "-cc.mode=3", "-cc.pass_config.fuse_norm_quant=true"]
        + ["--max-model-len", "512", "--kv-cache-dtype", "auto"]
    )
    expected = {
        "cache_config.block_size",
        "cache_config.cache_dtype",  # given explicitly, even though it equals the default
        "optimization_level",
        "compilation_config.mode",
        "compilation_config.pass_config.fuse_norm_quant",
        "model_config.max_model_len",
        "scheduler_config.max_model_len",
    }
    assert args.user_set_paths() == expected
    assert expected <= user_sources(args.create_engine_config())
    assert parse([]).user_set_paths() == set()


def test_user_set_paths_from_python_construction() -> None:
    args = EngineArgs(max_num_seqs=8, compilation_config=CompilationConfig(backend="eager"))
    assert args.user_set_paths() == {
        "scheduler_config.max_num_seqs",
        "compilation_config.backend",
    }
    cfg = args.create_engine_config()
    assert cfg.compilation_config.backend == "eager"
    assert {"scheduler_config.max_num_seqs", "compilation_config.backend"} <= user_sources(cfg)
    # None means "not given" for a nested config, as it does on the command line
    none = EngineArgs(compilation_config=None)  # type: ignore[arg-type]
    assert none.user_set_paths() == set()
    assert none.compilation_config == CompilationConfig()
    assert not any(
        p.startswith("compilation_config.") for p in user_sources(none.create_engine_config())
    )


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return str(path)


def test_config_file_keys_and_precedence(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "block-size: 8\nmax_num_seqs: 3\nenforce_eager: true\nenable_prefix_caching: false\n"
        "ignore_patterns: [x, y]\ncompilation_config:\n  mode: 1\n  backend: eager\n"
        "optimization_level: 1\n",
    )
    args = parse(["--max-num-seqs", "9", "--config", path, "-cc.mode=3"])
    assert args.block_size == 8 and args.enforce_eager is True
    assert args.enable_prefix_caching is False and args.ignore_patterns == ["x", "y"]
    assert args.max_num_seqs == 9  # the explicit flag wins even when given before --config
    assert args.compilation_config.mode is CompilationMode.VLLM_COMPILE
    assert args.compilation_config.backend == "eager"
    assert args.optimization_level is OptimizationLevel.O1
    assert "cache_config.block_size" in args.user_set_paths()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype: invalid choice: 'fp4' (choose from"),
        (["--max-num-seqs", "many"], "--max-num-seqs: invalid"),
        (["-O7"], "invalid choice '7' (choose from 0 (O0)"),
        (["-cc", "{mode: 3"], "--compilation-config/-cc: invalid JSON"),
        (["-cc", "[1]"], "expected a JSON object"),
        (["-cc.modee=3"], "unknown key 'modee' for --compilation-config/-cc (did you mean 'mode'"),
        (["-cc.pass_config.fuse=1"], "unknown key 'pass_config.fuse'"),
        (["--config", "/nonexistent.yaml"], "--config: file '/nonexistent.yaml' not found"),
        (["--max-num-seq", "3"], "did you mean --max-num-seqs"),
        (["-cc.mode"], "-cc.mode: expected a value"),
    ],
)
def test_bad_values_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = parse_error(argv, capsys)
    assert needle in err, err
    assert "Traceback" not in err and "usage:" not in err


def test_bad_config_file_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown key 'blocksize'" in parse_error(
        ["--config", write(tmp_path, "blocksize: 8\n")], capsys
    )
    assert "must hold a mapping" in parse_error(["--config", write(tmp_path, "- 1\n")], capsys)
    assert "expected true or false" in parse_error(
        ["--config", write(tmp_path, "enforce_eager: maybe\n")], capsys
    )


def test_validation_error_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    # pydantic's own error (located) and a validator's message (the field it names)
    with pytest.raises(ValueError, match=r"^--max-num-seqs: Input should be a valid integer"):
        EngineArgs(max_num_seqs="many").create_engine_config()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^--gpu-memory-utilization: gpu_memory_utilization"):
        parse(["--gpu-memory-utilization", "1.5"]).create_engine_config()
    with pytest.raises(ValueError, match=r"^--block-size: block_size must be one of"):
        parse(["--block-size", "12"]).create_engine_config()
    # A config-valued flag is built while parsing (as in vLLM): a one-line parse error.
    err = parse_error(["-cc.pass_config.fuse_norm_quant=sometimes"], capsys)
    assert "error: -cc.pass_config.fuse_norm_quant: Input should be a valid boolean" in err
    with pytest.raises(ValueError, match=r"^-cc\.pass_config\.fuse_norm_quant: Input should be"):
        EngineArgs(compilation_config={"pass_config": {"fuse_norm_quant": "sometimes"}})


def test_plain_argparse_parser_still_works() -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--block-size", "8", "-cc", '{"mode": 3}']))
    assert args.block_size == 8
    assert args.compilation_config.mode is CompilationMode.VLLM_COMPILE
    assert args.user_set_paths() == {"cache_config.block_size", "compilation_config.mode"}


json_leaf = st.one_of(st.integers(0, 9), st.booleans(), st.none())
keys = st.sampled_from(["a", "b", "c"])
json_dict = st.recursive(
    st.dictionaries(keys, json_leaf, max_size=3),
    lambda inner: st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_dict, json_dict)
def test_deep_merge_later_wins_and_keeps_the_rest(a: dict[str, Any], b: dict[str, Any]) -> None:
    before = copy.deepcopy(a)
    merged = deep_merge(a, b)
    assert a == before  # the earlier piece is not mutated
    assert set(merged) == set(a) | set(b)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(a.get(key), dict):
            assert merged[key] == deep_merge(a[key], value)
        else:
            assert merged[key] == value
    for key in set(a) - set(b):
        assert merged[key] == a[key]


# ----------------------------------------------------------------------------
# The real EngineArgs -> VllmConfig
# ----------------------------------------------------------------------------
ISSUE_FIELDS = """model tokenizer dtype max_model_len seed enforce_eager skip_tokenizer_init
block_size gpu_memory_utilization swap_space kv_cache_dtype enable_prefix_caching
prefix_caching_hash_algo cpu_offload_gb calculate_kv_scales kv_cache_memory_bytes
num_gpu_blocks_override max_num_seqs max_num_batched_tokens enable_chunked_prefill
async_scheduling scheduling_policy tensor_parallel_size pipeline_parallel_size
data_parallel_size distributed_executor_backend device load_format optimization_level
performance_mode compilation_config""".split()


def real_parser() -> argparse.ArgumentParser:
    from minivllm.args.engine_args import EngineArgs

    return EngineArgs.add_cli_args(FlexibleArgumentParser(prog="minivllm"))


def real_args(argv: list[str]) -> Any:
    from minivllm.args.engine_args import EngineArgs

    return EngineArgs.from_cli_args(real_parser().parse_args(argv))


def test_engine_args_has_every_knob_of_the_issue() -> None:

    from minivllm.args.engine_args import EngineArgs
    from minivllm.config.vllm import VllmConfig

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(ISSUE_FIELDS) <= names, set(ISSUE_FIELDS) - names
    # every argument names a real field of the config it feeds
    for spec in EngineArgs._specs:
        owner = VllmConfig if not spec.target.attr else spec.target.cls
        assert spec.field.name in {f.name for f in dataclasses.fields(owner)}
    assert "cache_dtype" not in names and "policy" not in names  # vLLM's names instead


def test_real_flags_resolve_into_vllm_config() -> None:
    from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
    from minivllm.config.optimization import OptimizationLevel
    from minivllm.platforms import CudaPlatform, override_platform

    args = real_args(
        "--block-size 32 --gpu-memory-utilization 0.5 --kv-cache-dtype fp8 --max-num-seqs 8 "
        "--no-enable-prefix-caching --max-model-len 1024 --scheduling-policy priority -O1 "
        "-cc.mode=VLLM_COMPILE -cc.cudagraph_mode=PIECEWISE -cc.cudagraph_capture_sizes=[1,2,4]".split()
    )
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        cfg = args.create_engine_config()
    assert cfg.cache_config.block_size == 32 and cfg.cache_config.cache_dtype == "fp8"
    assert cfg.cache_config.gpu_memory_utilization == 0.5
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.max_num_seqs == 8 and cfg.scheduler_config.policy == "priority"
    assert cfg.model_config.max_model_len == cfg.scheduler_config.max_model_len == 1024
    assert cfg.optimization_level is OptimizationLevel.O1
    assert cfg.compilation_config.mode is CompilationMode.VLLM_COMPILE
    assert cfg.compilation_config.cudagraph_mode is CUDAGraphMode.PIECEWISE
    assert cfg.compilation_config.cudagraph_capture_sizes == [1, 2, 4]
    explained = cfg.explain()
    for path in (
        "cache_config.block_size",
        "cache_config.cache_dtype",
        "scheduler_config.max_num_seqs",
        "scheduler_config.max_model_len",
        "optimization_level",
        "compilation_config.mode",
        "compilation_config.cudagraph_mode",
    ):
        assert explained[path]["source"] == "user", (path, explained[path])
    assert explained["cache_config.swap_space"]["source"] == "default"


def test_real_validation_error_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"^--gpu-memory-utilization: "):
        real_args(["--gpu-memory-utilization", "1.5"]).create_engine_config()


def test_real_unknown_cc_key_lists_valid_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        real_parser().parse_args(["-cc.cudagraph_modes=FULL"])
    err = capsys.readouterr().err
    assert "unknown key 'cudagraph_modes'" in err and "did you mean 'cudagraph_mode'" in err
    assert "valid keys:" in err and "pass_config" in err


def test_legacy_cc_key_marks_the_translated_field_as_user() -> None:
    from minivllm.config.compilation.modes import CompilationMode

    with pytest.warns(DeprecationWarning, match="level"):
        cfg = real_args(["-cc.level=0"]).create_engine_config()
    assert cfg.compilation_config.mode is CompilationMode.NONE
    assert cfg.explain()["compilation_config.mode"]["source"] == "user"


def test_prefix_caching_is_decided_per_model_when_unset() -> None:
    from minivllm.args.engine_args import EngineArgs

    # As in vLLM: None until the config is built, then per model (on for minivllm's).
    assert EngineArgs().enable_prefix_caching is None
    assert real_args([]).enable_prefix_caching is None
    assert real_args(["--enable-prefix-caching"]).enable_prefix_caching is True
    assert real_args(["--no-enable-prefix-caching"]).enable_prefix_caching is False
    unset = EngineArgs()
    assert "cache_config.enable_prefix_caching" not in unset.user_set_paths()
    assert unset.create_engine_config().cache_config.enable_prefix_caching is True
    off = EngineArgs(enable_prefix_caching=False).create_engine_config()
    assert off.cache_config.enable_prefix_caching is False
    assert off.explain()["cache_config.enable_prefix_caching"]["source"] == "user"


def test_unset_batch_limits_adapt_to_the_users_values() -> None:
    from minivllm.args.engine_args import EngineArgs
    from minivllm.platforms import CpuPlatform, override_platform

    with override_platform(CpuPlatform()):
        # max_num_seqs left unset is capped at the user's token budget ...
        sched = EngineArgs(max_num_batched_tokens=64).create_engine_config().scheduler_config
        assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (64, 64)
        sched = real_args(["--max-num-batched-tokens", "64"]).create_engine_config()
        assert sched.scheduler_config.max_num_seqs == 64
        # ... a default budget at max_num_seqs * max_model_len ...
        sched = EngineArgs(max_model_len=8).create_engine_config().scheduler_config
        assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (128, 1024)
        # ... and raised to max_model_len without chunked prefill.
        unchunked = EngineArgs(max_model_len=4096, enable_chunked_prefill=False)
        assert unchunked.create_engine_config().scheduler_config.max_num_batched_tokens == 4096
        # Two values the user set both still conflict.
        both = EngineArgs(max_num_batched_tokens=64, max_num_seqs=128)
        with pytest.raises(
            ValueError, match=r"max_num_batched_tokens \(64\).*max_num_seqs \(128\)"
        ):
            both.create_engine_config()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1k", 1000),
        ("1K", 1024),
        ("1m", 1_000_000),
        ("1M", 2**20),
        ("25.6k", 25_600),
        ("1.5k", 1500),
        ("2g", 2 * 10**9),
        ("2G", 2 * 2**30),
        ("4096", 4096),
        (" 8k ", 8000),
    ],
)
def test_human_readable_int(value: str, expected: int) -> None:
    from minivllm.utils.argparse_utils import human_readable_int

    assert human_readable_int(value) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--max-model-len", "1k"], 1000),
        (["--max-model-len", "1K"], 1024),
        (["--max-model-len", "1m"], 1_000_000),
        (["--max-model-len", "1M"], 2**20),
        (["--max-model-len", "1.5k"], 1500),
        (["--max-model-len", "auto"], -1),
        (["--max-model-len", "AUTO"], -1),
        (["--max-model-len", "-1"], -1),
        (["--max-model-len=2048"], 2048),
    ],
)
def test_max_model_len_takes_sizes_and_auto(argv: list[str], expected: int) -> None:
    assert real_args(argv).max_model_len == expected


def test_size_flags_are_the_ones_vllm_has() -> None:
    args = real_args(
        [
            "--max-num-batched-tokens",
            "8k",
            "--max-num-scheduled-tokens",
            "2k",
            "--kv-cache-memory-bytes",
            "2G",
            "-cc.max_cudagraph_capture_size=1K",
        ]
    )
    assert args.max_num_batched_tokens == 8000
    assert args.max_num_scheduled_tokens == 2000
    assert args.kv_cache_memory_bytes == 2 * 2**30
    # Sizes in dotted keys too, as vLLM's parser reads them.
    assert args.user_set_paths() >= {"compilation_config.max_cudagraph_capture_size"}
    assert args.compilation_config.max_cudagraph_capture_size == 1024


def test_a_retention_interval_minivllm_cannot_honour_is_refused_at_its_flag() -> None:
    args = real_args(["--prefix-cache-retention-interval", "64"])
    with pytest.raises(ValueError, match=r"^--prefix-cache-retention-interval: .*every full"):
        args.create_engine_config()


def test_auto_max_model_len_is_the_models_own() -> None:
    cfg = real_args(["--max-model-len", "auto"]).create_engine_config()
    default = real_args([]).create_engine_config()
    assert cfg.model_config.max_model_len == default.model_config.max_model_len > 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-model-len", "1.5K"], "did you mean 1.5k"),
        (["--max-model-len", "lots"], "--max-model-len: invalid integer 'lots'"),
        (["--max-num-batched-tokens", "8q"], "--max-num-batched-tokens: invalid integer '8q'"),
        (["--max-num-batched-tokens", "auto"], "invalid integer 'auto'"),
        (["--max-num-seqs", "1k"], "--max-num-seqs: invalid int value"),  # plain int, as in vLLM
    ],
)
def test_bad_sizes_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        real_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_flexible_argument_parser_importable_where_vllm_users_look() -> None:
    import minivllm.utils
    import minivllm.utils.argparse_utils

    assert minivllm.utils.FlexibleArgumentParser is FlexibleArgumentParser
    assert minivllm.utils.argparse_utils.FlexibleArgumentParser is FlexibleArgumentParser
    # vLLM's module path for both names still works (minivllm's own home: minivllm.args).
    from minivllm.args import EngineArgs as own_engine_args
    from minivllm.engine.arg_utils import EngineArgs as vllm_path_engine_args
    from minivllm.engine.arg_utils import FlexibleArgumentParser as from_arg_utils

    assert from_arg_utils is FlexibleArgumentParser
    assert vllm_path_engine_args is own_engine_args


# ----------------------------------------------------------------------------
# vLLM's parsed values: -O and config-valued flags
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-O", "1"], "1"),
        (["-O", "2"], "2"),
        (["-O", "3"], "3"),
        (["-O0"], "0"),
        (["-O1"], "1"),
        (["-O2"], "2"),
        (["-O3"], "3"),
    ],
)
def test_optimization_level_as_vllm_parses_it(argv: list[str], expected: str) -> None:
    from minivllm.config.compilation import CompilationConfig
    from minivllm.config.optimization import OptimizationLevel

    parsed = real_parser().parse_args(argv)
    # vLLM's parser gives the digit string; minivllm's level equals it, its number
    # and its enum member alike.
    assert parsed.optimization_level == expected
    assert parsed.optimization_level == int(expected)
    assert parsed.optimization_level is OptimizationLevel(int(expected))
    assert not parsed.optimization_level != expected
    assert isinstance(parsed.compilation_config, CompilationConfig)
    assert parsed.compilation_config.mode is None


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_cc_mode_is_a_compilation_config(mode: int) -> None:
    parsed = real_parser().parse_args([f"-cc.mode={mode}"])
    assert parsed.compilation_config.mode == mode


def test_compilation_config_flag_values_are_config_objects() -> None:
    from minivllm.config.compilation import CompilationConfig

    parser = real_parser()
    assert parser.parse_args([]).compilation_config == CompilationConfig()
    text = '{"mode": 3, "cudagraph_capture_sizes": [1, 2, 4, 8], "backend": "eager"}'
    for argv in (["-cc", text], [f"--compilation-config={text}"]):
        compilation_config = parser.parse_args(argv).compilation_config
        assert isinstance(compilation_config, CompilationConfig)
        assert (
            compilation_config.mode,
            compilation_config.cudagraph_capture_sizes,
            compilation_config.backend,
        ) == (3, [1, 2, 4, 8], "eager")
    # A fresh default per parse: changing one never leaks into the next.
    parser.parse_args([]).compilation_config.custom_ops.append("+rms_norm")
    assert parser.parse_args([]).compilation_config.custom_ops == []


def test_bad_compilation_config_value_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        real_parser().parse_args(["-cc.mode=7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-cc.mode: Invalid compilation mode 7" in err, err


def test_engine_args_compilation_config_is_an_object() -> None:
    from minivllm.args.engine_args import EngineArgs
    from minivllm.config.compilation import CompilationConfig
    from minivllm.config.compilation.modes import CompilationMode

    default = EngineArgs()
    assert isinstance(default.compilation_config, CompilationConfig)
    assert default.compilation_config.mode is None and default.user_set_paths() == set()
    from_dict = EngineArgs(compilation_config={"mode": 3})
    assert from_dict.compilation_config == CompilationConfig(mode=3)
    assert from_dict.user_set_paths() == {"compilation_config.mode"}
    given = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    cfg = EngineArgs(compilation_config=given).create_engine_config()
    assert cfg.explain()["compilation_config.mode"]["source"] == "user"
    assert given.cudagraph_mode is None  # resolution works on a copy, not the caller's


def test_config_flags_given_as_objects_keep_user_provenance() -> None:
    # Keys the user gave are "user" even when they equal what resolution would pick.
    cfg = real_args(["-cc.backend=inductor", "-O1"]).create_engine_config()
    explained = cfg.explain()
    assert explained["compilation_config.backend"] == {"value": "inductor", "source": "user"}
    assert explained["optimization_level"]["source"] == "user"
    assert explained["compilation_config.mode"]["source"] != "user"
    # The same object handed over by a caller of the parser (vLLM's flow).
    parsed = real_parser().parse_args(["-cc.mode=0"])
    from minivllm.args.engine_args import EngineArgs

    args = EngineArgs.from_cli_args(parsed)
    assert args.compilation_config is parsed.compilation_config
    assert args.create_engine_config().explain()["compilation_config.mode"]["source"] == "user"
