"""The README's examples work as written.

Every ``minivllm config ...`` line of its bash blocks runs through the CLI
(in-process, which is faster than a subprocess per line); a line annotated
``# error`` must exit with status 2.  Other shell lines (``printf``) run in a
shell.  Python blocks are executed.  The set-up commands themselves
(``pip install ...``) are what CI runs, so they are skipped here.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from minivllm.entrypoints.cli.main import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def _config_lines() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        lines += [
            line for line in block.splitlines() if line.startswith(("minivllm config", "printf"))
        ]
    return lines


def test_readme_has_examples() -> None:
    assert len(_config_lines()) >= 5
    assert len(_blocks("python")) >= 2


@pytest.mark.parametrize("line", _config_lines())
def test_bash_example(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    if line.startswith("printf"):
        subprocess.run(line, shell=True, check=True)
        return
    command, _, comment = line.partition("#")
    try:
        rc = main(shlex.split(command)[1:])
    except SystemExit as exc:  # argparse exits for bad values
        rc = exc.code
    out, err = capsys.readouterr()
    if "error" in comment:
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    else:
        assert rc in (0, None) and out.strip(), err


def _offline_python_blocks() -> list[str]:
    # Client examples need a server: tests/entrypoints/openai/test_readme_serving.py runs them.
    return [b for b in _blocks("python") if "base_url=" not in b]


@pytest.mark.parametrize("index", range(len(_offline_python_blocks())))
def test_python_example(index: int) -> None:
    exec(compile(_offline_python_blocks()[index], f"README-python-{index}", "exec"), {})
