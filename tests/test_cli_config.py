"""``minivllm config``: resolved configuration as JSON, ``--explain``, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from minivllm import __version__
from minivllm.entrypoints.cli.main import main


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minivllm.entrypoints.cli", *argv],
        capture_output=True,
        text=True,
        timeout=240,
    )


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main`` in-process (much faster than a subprocess); returns (status, out, err)."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def explain_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, Any]]:
    status, out, err = run_main(capsys, "config", "--explain", "--format", "json", *argv)
    assert status == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------
# As a real process
# ----------------------------------------------------------------------------
def test_config_subprocess_prints_valid_json() -> None:
    proc = run_cli("config")
    assert proc.returncode == 0, proc.stderr
    tree = json.loads(proc.stdout)
    assert tree["model_config"]["model"].endswith(".gguf")  # the bundled default model
    assert tree["compilation_config"]["mode"] in {"VLLM_COMPILE", "NONE"}  # enums by name
    assert tree["optimization_level"] == "O2"
    assert isinstance(tree["cache_config"]["block_size"], int)


def test_explain_on_hopper_with_user_piecewise(capsys: pytest.CaptureFixture[str]) -> None:
    # In-process, unlike its neighbours: a real process printing clean JSON is the
    # test above; a subprocess here would only add ~5 s of start-up.
    explained = explain_json(
        capsys, "--platform", "cuda:9.0", "-O3", "-cc.cudagraph_mode=PIECEWISE"
    )
    assert explained["compilation_config.cudagraph_mode"] == {
        "value": "PIECEWISE",
        "source": "user",
    }
    assert explained["optimization_level"] == {"value": "O3", "source": "user"}
    sizes = explained["compilation_config.cudagraph_capture_sizes"]
    assert sizes["source"] == "rule" and sizes["rule"] and sizes["reason"]
    assert len(sizes["value"]) == 51 and max(sizes["value"]) == 512  # the SM90 reference grid
    assert explained["compilation_config.mode"]["value"] == "VLLM_COMPILE"
    assert explained["cache_config.block_size"]["source"] == "platform"
    assert explained["cache_config.swap_space"] == {"value": 4.0, "source": "default"}


def test_bad_value_subprocess_one_line_exit_2() -> None:
    proc = run_cli("config", "--kv-cache-dtype", "fp4")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "--kv-cache-dtype" in proc.stderr and "'auto'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version_and_lazy_subcommands() -> None:
    code = (
        "import sys\n"
        "from minivllm.entrypoints.cli import main as cli\n"
        "cli.build_parser(['--version'])\n"
        "heavy = [m for m in ('torch', 'minivllm.entrypoints.cli.config', 'minivllm.config.model')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "cli.main(['--version'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"minivllm {__version__}"


# ----------------------------------------------------------------------------
# In-process
# ----------------------------------------------------------------------------
def test_explain_default_model_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    explained = explain_json(capsys, "--platform", "cpu")
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "NONE"
    assert graphs["source"] in {"rule", "platform"} and graphs["rule"] and graphs["reason"]
    assert explained["optimization_level"] == {"value": "O2", "source": "default"}
    assert explained["compilation_config.mode"]["source"] == "rule"
    assert all(e["source"] != "user" for e in explained.values())
    assert {"value", "source"} <= set(explained["scheduler_config.max_num_seqs"])


def test_explain_o0(capsys: pytest.CaptureFixture[str]) -> None:
    explained = explain_json(capsys, "-O0", "--platform", "cuda:9.0")
    assert explained["optimization_level"] == {"value": "O0", "source": "user"}
    mode = explained["compilation_config.mode"]
    assert mode["value"] == "NONE" and mode["source"] == "rule" and "-O0" in mode["reason"]
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "NONE" and graphs["source"] == "level"


def test_explain_table_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_main(
        capsys, "config", "--explain", "--platform", "cuda:9.0", "--block-size", "32"
    )
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["PATH", "VALUE", "SOURCE", "REASON"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["cache_config.block_size"].split()[1:3] == ["32", "user"]
    sizes = rows["compilation_config.cudagraph_capture_sizes"]
    assert "(51 items)" in sizes and "rule:" in sizes  # long values shortened, rule named


def test_positional_model_and_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from minivllm.config.model import ModelConfig

    gguf = ModelConfig().model  # the bundled default, resolved by the model config
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(
        "max_num_seqs: 4\nblock-size: 32\nenable_prefix_caching: false\n"
        "compilation_config:\n  mode: 0\n"
    )
    explained = explain_json(
        capsys, gguf, "--config", str(cfg), "--max-num-seqs", "8", "--platform", "cpu"
    )
    assert explained["model_config.model"] == {"value": gguf, "source": "user"}
    assert explained["scheduler_config.max_num_seqs"] == {"value": 8, "source": "user"}
    assert explained["cache_config.block_size"] == {"value": 32, "source": "user"}
    assert explained["cache_config.enable_prefix_caching"]["value"] is False
    assert explained["compilation_config.mode"] == {"value": "NONE", "source": "user"}


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["-O9"], ["-O", "invalid choice '9'", "0 (O0)"]),
        (["-cc", "{bad"], ["--compilation-config/-cc", "invalid JSON"]),
        (["-cc.nope=1"], ["unknown key 'nope'", "valid keys:", "cudagraph_mode"]),
        (["--config", "/no/such.yaml"], ["--config", "not found"]),
        (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
        (["--max-num-seqs", "x"], ["--max-num-seqs", "invalid int value"]),
        (["--platform", "tpu"], ["--platform", "cuda:9.0"]),
        (["--blok-size", "16"], ["unrecognized arguments", "did you mean --block-size"]),
        (["--scheduling-policy", "lifo"], ["--scheduling-policy", "'fcfs', 'priority'"]),
    ],
)
def test_bad_values_exit_2_with_one_line(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_main(capsys, "config", *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("minivllm config: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_no_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(capsys)
    assert status == 2 and err.count("\n") == 1 and "COMMAND" in err


def test_explain_marks_json_and_dotted_config_keys_as_user(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explained = explain_json(capsys, "-O1", "-cc", '{"backend": "inductor"}', "-cc.mode=3")
    assert explained["optimization_level"] == {"value": "O1", "source": "user"}
    assert explained["compilation_config.backend"] == {"value": "inductor", "source": "user"}
    assert explained["compilation_config.mode"] == {"value": "VLLM_COMPILE", "source": "user"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-ac.backend=FLASH_ATTN"], "'FLASH_ATTN' is not available in minivllm"),
        (["--platform", "cpu", "-ac.backend=TRITON_ATTN"], "on this platform: CPU_SDPA"),
    ],
)
def test_attention_backend_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    status, out, err = run_main(capsys, "config", *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_attention_backend_by_vllm_name(capsys: pytest.CaptureFixture[str]) -> None:
    explained = explain_json(capsys, "--platform", "cuda:9.0", "-ac.backend=TRITON_ATTN")
    assert explained["attention_config.backend"] == {"value": "TRITON_PAGED", "source": "user"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nnodes", "2"], "nnodes=2 must divide the ranks"),
        (["--master-port", "0"], "master_port must be a TCP port"),
        (["--node-rank=1"], "node_rank=1 with nnodes=1"),
    ],
)
def test_vllm_parallel_flags_minivllm_refuses(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    status, out, err = run_main(capsys, "config", *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_vllm_parallel_flags_at_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    explained = explain_json(capsys, "--nnodes", "1", "--master-addr", "127.0.0.1")
    assert explained["parallel_config.nnodes"] == {"value": 1, "source": "user"}


# ----------------------------------------------------------------------------
# Attention backend and CUDA graphs: the resolved mode is the one that runs
# ----------------------------------------------------------------------------
def test_explain_cpu_names_the_platform_as_the_reason_for_no_graphs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explained = explain_json(capsys, "--platform", "cpu")
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "NONE" and graphs["source"] == "platform"
    assert graphs["reason"] == (
        "cudagraph_mode FULL_AND_PIECEWISE -> NONE: CpuPlatform() has no CUDA graphs "
        "(no static graph mode)"
    )
    backend = explained["attention_config.backend"]
    assert backend["value"] == "CPU_SDPA" and backend["source"] == "platform"
    assert backend["rule"] == "choose_attention_backend"


def test_explain_cuda_with_sdpa_reports_the_piecewise_downgrade(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explained = explain_json(capsys, "--platform", "cuda:9.0", "-O3", "-ac.backend=CPU_SDPA")
    assert explained["attention_config.backend"] == {"value": "CPU_SDPA", "source": "user"}
    assert explained["compilation_config.cudagraph_mode"] == {
        "value": "PIECEWISE",
        "source": "rule",
        "rule": "resolve_cudagraph_mode_and_sizes",
        "reason": "cudagraph_mode FULL_AND_PIECEWISE -> PIECEWISE: attention backend CPU_SDPA "
        "has CUDA graph support NEVER (no full graphs; piecewise ones at most)",
    }
    # Piecewise graphs are still captured, at the usual sizes.
    assert len(explained["compilation_config.cudagraph_capture_sizes"]["value"]) == 51


def test_explain_cuda_with_triton_keeps_full_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["-ac.backend=TRITON_PAGED"]):
        explained = explain_json(capsys, "--platform", "cuda:9.0", "-O3", *argv)
        assert explained["attention_config.backend"]["value"] == "TRITON_PAGED"
        graphs = explained["compilation_config.cudagraph_mode"]
        assert graphs == {
            "value": "FULL_AND_PIECEWISE",
            "source": "level",
            "rule": "_apply_optimization_level_defaults",
            "reason": "cudagraph_mode None -> FULL_AND_PIECEWISE: default of -O3",
        }
    backend = explain_json(capsys, "--platform", "cuda:9.0")["attention_config.backend"]
    assert backend["source"] == "platform" and "when triton is installed" in backend["reason"]


def test_explain_cuda_without_triton_defaults_to_sdpa_and_piecewise(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("minivllm.platforms.cuda.triton_available", lambda: False)
    explained = explain_json(capsys, "--platform", "cuda:9.0", "-O3")
    backend = explained["attention_config.backend"]
    assert backend["value"] == "CPU_SDPA" and backend["source"] == "platform"
    assert "triton is not installed" in backend["reason"]
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "PIECEWISE" and "CPU_SDPA" in graphs["reason"]
    status, out, err = run_main(
        capsys, "config", "--platform", "cuda:9.0", "-ac.backend=TRITON_PAGED"
    )
    assert status == 2 and out == "" and "needs the triton package" in err, err


def test_explain_cpu_device_on_a_cuda_platform_runs_without_graphs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explained = explain_json(capsys, "--platform", "cuda:9.0", "--device", "cpu")
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "NONE" and graphs["rule"] == "device_type"
    assert graphs["reason"] == (
        "cudagraph_mode FULL_AND_PIECEWISE -> NONE: the device is cpu, and CUDA graphs "
        "need a CUDA device"
    )
    assert explained["compilation_config.cudagraph_capture_sizes"]["value"] == []
    backend = explained["attention_config.backend"]
    assert backend["value"] == "CPU_SDPA" and "the device is cpu" in backend["reason"]


def test_explain_sdpa_without_piecewise_compile_runs_without_graphs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explained = explain_json(
        capsys, "--platform", "cuda:9.0", "-cc.mode=0", "-cc.cudagraph_mode=FULL_DECODE_ONLY",
        "-ac.backend=CPU_SDPA",
    )  # fmt: skip
    graphs = explained["compilation_config.cudagraph_mode"]
    assert graphs["value"] == "NONE" and graphs["rule"] == "resolve_cudagraph_mode_and_sizes"
    assert graphs["reason"].startswith("cudagraph_mode FULL_DECODE_ONLY -> NONE: attention")
    sizes = explained["compilation_config.cudagraph_capture_sizes"]
    assert sizes["value"] == [] and sizes["rule"] == "resolve_cudagraph_mode_and_sizes"


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (
            ["-cc.cudagraph_mode=FULL", "-ac.backend=CPU_SDPA"],
            ["FULL is not supported with the CPU_SDPA attention backend", "PIECEWISE"],
        ),
        (
            ["--device", "cpu", "-ac.backend=TRITON_PAGED"],
            ["TRITON_PAGED runs on CUDA devices only", "-ac.backend=CPU_SDPA"],
        ),
    ],
)
def test_graphs_the_attention_backend_cannot_run_are_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    status, out, err = run_main(capsys, "config", "--platform", "cuda:9.0", *argv)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert all(n in err for n in needles), err
