"""``minivllm generate`` and ``minivllm chat`` on the default model, as real processes.

Greedy CLI output must equal `LLM.generate` / `LLM.chat` for the same inputs; bad
sampling values must exit 2 with one line before any model is loaded.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivllm.args.engine_args import EngineArgs
from minivllm.args.parser import FlexibleArgumentParser
from minivllm.entrypoints.cli.generate import OrderedWriter, make_headers
from minivllm.entrypoints.cli.main import main
from minivllm.entrypoints.cli.sampling_args import add_sampling_args, sampling_params_from_args

ENGINE_FLAGS = ["--dtype", "float32", "--num-gpu-blocks-override", "64", "-O0"]
SAMPLING_FLAGS = ["--max-tokens", "8", "--temperature", "0"]
PROMPTS = ["Hello, my name is", "The capital of France is"]


def start_cli(*argv: str, stdin: str | None = None) -> subprocess.Popen[str]:
    stdin_file = tempfile.TemporaryFile("w+")  # a file, so nothing waits on a pipe
    stdin_file.write(stdin or "")
    stdin_file.seek(0)
    return subprocess.Popen(
        [sys.executable, "-m", "minivllm.entrypoints.cli", *argv],
        stdin=stdin_file,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return finish(start_cli(*argv, stdin=stdin))


CHAT_INPUT = "Hello\n\nWhat is 2+2?\n/exit\nignored\n"


@pytest.fixture(scope="module")
def procs():  # type: ignore[no-untyped-def]
    """The model-loading CLI runs, started together so their start-ups overlap."""
    started = {
        "one": start_cli("generate", PROMPTS[0], *ENGINE_FLAGS, *SAMPLING_FLAGS),
        "stream": start_cli("generate", *PROMPTS, "--stream", *ENGINE_FLAGS, *SAMPLING_FLAGS),
        "chat": start_cli("chat", *ENGINE_FLAGS, *SAMPLING_FLAGS, stdin=CHAT_INPUT),
    }
    yield started
    for proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def llm(procs):  # type: ignore[no-untyped-def]
    from minivllm import LLM

    return LLM(dtype="float32", num_gpu_blocks_override=64, optimization_level=0)


@pytest.fixture(scope="module")
def greedy():  # type: ignore[no-untyped-def]
    from minivllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=8)


# ----------------------------------------------------------------------------
# Real processes on the default model
# ----------------------------------------------------------------------------
def test_generate_one_prompt_prints_the_bare_completion(procs, llm, greedy) -> None:  # type: ignore[no-untyped-def]
    proc = finish(procs["one"])
    assert proc.returncode == 0, proc.stderr
    expected = llm.generate(PROMPTS[0], greedy, use_tqdm=False)[0].outputs[0].text
    assert expected.strip()
    assert proc.stdout == expected + "\n"


def test_generate_stream_several_prompts_matches_llm(procs, llm, greedy) -> None:  # type: ignore[no-untyped-def]
    proc = finish(procs["stream"])
    assert proc.returncode == 0, proc.stderr
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    expected = "".join(
        f"=== prompt {i + 1}/2: {p!r} ===\n{o.outputs[0].text}\n"
        for i, (p, o) in enumerate(zip(PROMPTS, outputs, strict=True))
    )
    assert proc.stdout == expected


def test_chat_through_a_pipe_keeps_history(procs, llm, greedy) -> None:  # type: ignore[no-untyped-def]
    proc = finish(procs["chat"])
    assert proc.returncode == 0, proc.stderr
    turns = [{"role": "user", "content": "Hello"}]
    first = llm.chat(turns, greedy, use_tqdm=False)[0].outputs[0].text
    turns += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": "What is 2+2?"},
    ]
    second = llm.chat(turns, greedy, use_tqdm=False)[0].outputs[0].text
    assert first.strip() and second.strip()
    assert proc.stdout == f"{first}\n{second}\n"  # no prompt shown when stdin is a pipe


def test_bad_value_exits_2_with_one_line() -> None:
    proc = run_cli("generate", "hi", "--temperature", "-1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--temperature" in lines[0], proc.stderr


# ----------------------------------------------------------------------------
# In-process: flag checks happen before the engine starts, so these are fast
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["generate", "hi", "--top-p", "0"], "--top-p"),
        (["generate", "hi", "--max-tokens", "0"], "--max-tokens"),
        (["generate", "hi", "--n", "2", "--temperature", "0"], "--n"),
        (["chat", "--n", "2", "--temperature", "1"], "--n"),
        (["generate", "hi", "--top-k", "-5"], "--top-k"),
        (["generate", "hi", "--max-tokens", "many"], "--max-tokens"),
    ],
)
def test_bad_sampling_flags_name_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and flag in err, err


def _parse(*argv: str):  # type: ignore[no-untyped-def]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    add_sampling_args(parser)
    return parser.parse_args(list(argv))


def test_seed_seeds_requests_only_when_given() -> None:
    # --seed belongs to the engine (default 0); its default must not fix every request.
    assert sampling_params_from_args(_parse("--temperature", "1")).seed is None
    params = sampling_params_from_args(_parse("--seed", "7", "--stop", "a", "--stop", "bc"))
    assert params.seed == 7 and params.stop == ["a", "bc"]


@given(st.data(), st.booleans(), st.integers(min_value=1, max_value=4))
def test_ordered_writer_output_is_independent_of_arrival_order(
    data: st.DataObject, stream: bool, num_keys: int
) -> None:
    pieces = {
        (str(k), 0): data.draw(st.lists(st.text(max_size=3), min_size=1, max_size=4))
        for k in range(num_keys)
    }
    keys = list(pieces)
    headers = make_headers([f"p{k}" for k in range(num_keys)], [k[0] for k in keys], 1)
    # Any interleaving that keeps each completion's own deltas in order.
    queue = [(k, i) for k in keys for i in range(len(pieces[k]))]
    data.draw(st.randoms()).shuffle(queue)
    cursor = dict.fromkeys(keys, 0)
    out = io.StringIO()
    writer = OrderedWriter(out, keys, headers, stream)
    for key, _ in queue:
        i = cursor[key]
        cursor[key] += 1
        writer.add(key, pieces[key][i], finished=i == len(pieces[key]) - 1)
    assert writer.done
    expected = "".join(
        (headers[k] + "\n" if k in headers else "") + "".join(pieces[k]) + "\n" for k in keys
    )
    assert out.getvalue() == expected


def test_ordered_writer_streams_the_current_completion_only() -> None:
    keys = [("a", 0), ("b", 0)]
    out = io.StringIO()
    writer = OrderedWriter(out, keys, {}, stream=True)
    writer.add(("b", 0), "later", finished=False)
    assert out.getvalue() == ""  # b waits for a
    writer.add(("a", 0), "first", finished=False)
    assert out.getvalue() == "first"  # a is written before it finishes
    writer.add(("a", 0), "!", finished=True)
    assert out.getvalue() == "first!\nlater"  # b's buffer flushes once a is done
    quiet = io.StringIO()
    batch = OrderedWriter(quiet, keys[:1], {}, stream=False)
    batch.add(("a", 0), "x", finished=False)
    assert quiet.getvalue() == ""  # without --stream nothing is written before the end
