"""The README's curl and openai-client examples work against a real server.

They are run as written, except that the test server's address replaces
``http://127.0.0.1:8000`` and its API key is passed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from server_utils import API_KEY, RemoteServer

README = Path(__file__).resolve().parents[3] / "README.md"
DEFAULT_URL = "http://127.0.0.1:8000"


def _serve_section() -> str:
    text = README.read_text()
    return text.split("## Serve", 1)[1].split("\n## ", 1)[0]


def _curl_commands() -> list[str]:
    block = re.findall(r"```bash\n(.*?)```", _serve_section(), flags=re.S)[0]
    return [c.replace("\\\n", " ") for c in block.strip().split("\n\n")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_examples(server: RemoteServer) -> None:
    commands = _curl_commands()
    assert len(commands) == 2
    for command in commands:
        command = command.replace(DEFAULT_URL, server.url)
        command += f' -H "Authorization: Bearer {API_KEY}"'
        out = subprocess.run(command, shell=True, check=True, capture_output=True, text=True)
        body = json.loads(out.stdout)
        choice = body["choices"][0]
        text = choice.get("text") or choice["message"]["content"]
        assert text and body["usage"]["completion_tokens"] > 0


def test_readme_openai_example(server: RemoteServer, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.findall(r"```python\n(.*?)```", _serve_section(), flags=re.S)[0]
    code = block.replace(f'"{DEFAULT_URL}/v1"', f'"{server.url}/v1"').replace(
        'api_key="EMPTY"', f'api_key="{API_KEY}"'
    )
    assert code != block
    exec(compile(code, "README-openai-example", "exec"), {})
    printed = capsys.readouterr().out
    assert "completion_tokens" in printed and len(printed.strip()) > 20


def test_readme_responses_and_messages_example(
    server: RemoteServer, capsys: pytest.CaptureFixture[str]
) -> None:
    [block] = [
        b
        for b in re.findall(r"```python\n(.*?)```", _serve_section(), flags=re.S)
        if "messages.create" in b
    ]
    code = (
        block.replace(f'"{DEFAULT_URL}/v1"', f'"{server.url}/v1"')
        .replace(f'"{DEFAULT_URL}"', f'"{server.url}"')
        .replace('api_key="EMPTY"', f'api_key="{API_KEY}"')
    )
    assert code.count(server.url) == 2
    exec(compile(code, "README-responses-example", "exec"), {})
    printed = capsys.readouterr().out
    assert "input_tokens" in printed and "output_tokens" in printed
