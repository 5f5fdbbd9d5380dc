"""`benchmarks/tree_ab.py` compares two source trees: each minivllm child it starts
must import the tree it measures, even when run from inside another checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import vs_llamacpp as vs  # noqa: E402


def test_a_child_imports_the_measured_tree_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "old" / "minivllm"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "probe.py").write_text("print(__file__)\n")
    monkeypatch.setattr(vs, "ROOT", tmp_path / "old")
    # Run as the benchmarks do: `python -m`, from the repository root, whose own
    # minivllm package would otherwise come first on the path.
    out = subprocess.run(
        [sys.executable, "-m", "minivllm.probe"],
        cwd=REPO,
        env=vs.minivllm_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()) == other / "probe.py"
