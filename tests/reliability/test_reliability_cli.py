"""The CLI for a new user, without loading a model: a busy port fails at once, --help
comes in groups, an empty chat says so, and plotting is an optional extra."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minivllm.entrypoints.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_busy_port_fails_before_loading_the_model() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        start = time.monotonic()
        proc = _cli("serve", "--port", str(port), "-O0")
        elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0], lines
    assert "loading the weights" not in proc.stderr and "Serving on" not in proc.stdout
    assert elapsed < 30


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``minivllm ARGV`` run in this process."""
    from minivllm.entrypoints.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.mark.parametrize("command", ["generate", "serve", "chat"])
def test_help_comes_in_groups(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, short, _ = _help(capsys, command, "--help")
    assert status == 0
    lines = short.splitlines()
    assert len(lines) < 90, len(lines)
    assert "CacheConfig" in short and "--block-size" not in short
    if command != "serve":
        assert lines[4] == "sampling:", lines[:6]  # right under the usage and description
    else:
        assert "--port" in short and "--enable-log-requests" in short
    status, every, _ = _help(capsys, command, "--help=all")
    assert status == 0 and "--block-size" in every
    assert len(every.splitlines()) > 3 * len(lines)
    group = _help(capsys, command, "--help=cacheconfig")[1]
    assert "--block-size" in group and "--max-model-len" not in group
    assert "--enable-prefix-caching" in _help(capsys, command, "--help=prefix")[1]
    status, _, err = _help(capsys, command, "--help=NoSuchThing")
    assert status == 2 and "CacheConfig" in err


@pytest.mark.parametrize(
    ("bench", "own", "default"),
    [
        ("latency", "--batch-size", "(default: 8)"),
        ("throughput", "--num-prompts", "default"),
        ("startup", "--run-timeout", "(default: 1800.0)"),
        ("serve", "--base-url", "default"),
    ],
)
def test_bench_help_is_short_with_defaults(
    bench: str, own: str, default: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench X --help`` shows the benchmark's flags with their defaults and names the
    engine flag groups; ``--help=all`` / ``--help=<group>`` show the engine flags."""
    status, short, _ = _help(capsys, "bench", bench, "--help")
    assert status == 0
    lines = short.splitlines()
    assert len(lines) < 90, len(lines)
    line = next(i for i, text in enumerate(lines) if text.lstrip().startswith(own))
    assert default in " ".join(lines[line : line + 4]), lines[line : line + 4]
    assert "--block-size" not in short
    if bench == "serve":  # a pure HTTP client: no engine flags
        return
    assert "CacheConfig" in short and "--help=all" in short
    status, every, _ = _help(capsys, "bench", bench, "--help=all")
    assert status == 0 and "--block-size" in every and own in every
    assert "--block-size" in _help(capsys, "bench", bench, "--help=cacheconfig")[1]


def test_chat_with_empty_stdin_says_so_without_loading_the_model() -> None:
    for stdin in ("", "\n  \n"):
        start = time.monotonic()
        proc = _cli("chat", stdin=stdin)
        assert proc.returncode == 0 and "no input" in proc.stderr, proc.stderr
        assert "loading the weights" not in proc.stderr
        assert time.monotonic() - start < 30


def test_plotting_is_an_optional_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert project["optional-dependencies"]["plot"] == ["matplotlib"]
    import importlib.util

    from minivllm.entrypoints.bench import plot

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    with pytest.raises(ValueError, match=r"minivllm\[plot\]"):
        plot.require_matplotlib()
    # The server never imports it.
    code = ("import sys, minivllm.entrypoints.openai.api_server, minivllm.entrypoints.cli.serve;"
            "sys.exit('matplotlib' in sys.modules)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
