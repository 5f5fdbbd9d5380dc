"""benchmarks/gguf_zoo.py and the table of vs_llamacpp.py's ``--matrix``, without llama.cpp.

Each family is written at a tiny size (2 layers, hidden 64) and read back with
``gguf.GGUFReader`` and with minivllm's config mapping; one tiny file, with
the SmolLM2 tokenizer copied in, is loaded by minivllm and generates text.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gguf
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gguf_zoo  # noqa: E402
import llamacpp_matrix as matrix  # noqa: E402

from minivllm.transformers_utils.config import gguf_to_hf_config, read_gguf_metadata  # noqa: E402

TINY_VOCAB = 256


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("name", sorted(gguf_zoo.FAMILIES))
def test_tiny_family_reads_back(tmp_path: Path, name: str) -> None:
    """Arch metadata and every tensor's shape are what the family says, and
    minivllm maps the file onto a config of the same dimensions."""
    family = gguf_zoo.tiny(gguf_zoo.FAMILIES[name])
    path = gguf_zoo.write_random_gguf(tmp_path / "m.gguf", family, vocab_size=TINY_VOCAB)
    reader = gguf.GGUFReader(str(path))
    arch = family.arch
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.block_count") == family.layers
    assert _field(reader, f"{arch}.embedding_length") == family.hidden
    assert _field(reader, f"{arch}.attention.head_count_kv") == family.kv_heads
    assert _field(reader, f"{arch}.attention.key_length") == family.head_dim
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    expected = {n: s for n, s, _ in gguf_zoo.tensor_specs(family, TINY_VOCAB)}
    assert shapes == expected
    assert ("blk.0.attn_q.bias" in shapes) == family.qkv_bias
    assert ("blk.0.attn_k_norm.weight" in shapes) == family.qk_norm
    assert ("blk.1.post_ffw_norm.weight" in shapes) == (arch == "gemma3")
    cfg = gguf_to_hf_config(path)
    assert (cfg.num_hidden_layers, cfg.intermediate_size) == (family.layers, family.ffn)
    assert (cfg.num_key_value_heads, cfg.vocab_size) == (family.kv_heads, TINY_VOCAB)
    assert cfg.tie_word_embeddings


def test_real_shapes_are_half_to_three_billion_parameters() -> None:
    """The full-size families are the sizes they claim (with the shipped vocabularies)."""
    vocab = {"smollm2": 49152, "gemma3": 262144}
    sizes = {}
    for name, family in gguf_zoo.FAMILIES.items():
        specs = gguf_zoo.tensor_specs(family, vocab[family.tokenizer])
        sizes[name] = sum(math.prod(s) for _, s, _ in specs) / 1e9
    assert 0.3 < sizes["qwen2-0.5b"] < sizes["qwen3-0.6b"] < sizes["llama-1b"] < 1.3
    assert 0.9 < sizes["gemma3-1b"] < 1.1 and 2.8 < sizes["llama-3b"] < 3.4
    assert "llama-3b" not in gguf_zoo.DEFAULT_FAMILIES
    assert gguf_zoo.family_names(None, with_3b=True)[-1] == "llama-3b"


def test_tiny_file_with_copied_tokenizer_generates(tmp_path: Path) -> None:
    """The shipped tokenizer is copied key for key, and minivllm loads the file,
    tokenizes a prompt and generates a few tokens with finite logprobs."""
    from minivllm import LLM, SamplingParams

    family = gguf_zoo.tiny(gguf_zoo.FAMILIES["qwen2-0.5b"])
    path = gguf_zoo.write_random_gguf(tmp_path / "qwen2-tiny.gguf", family)
    source = read_gguf_metadata(gguf_zoo.shipped_gguf("smollm2"))
    written = read_gguf_metadata(path)
    for key, value in source.items():
        if key.startswith("tokenizer."):
            assert written[key] == value, key
    engine = dict(max_model_len=64, num_gpu_blocks_override=16, block_size=16, enforce_eager=True)
    llm = LLM(model=str(path), **engine)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=1)
    (out,) = llm.generate(["Hello there"], params, use_tqdm=False)
    completion = out.outputs[0]
    assert len(completion.token_ids) == 4
    assert all(
        abs(lp[t].logprob) < 1e3
        for t, lp in zip(completion.token_ids, completion.logprobs, strict=True)
    )


def test_files_are_cached_by_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second request for the same shape reuses the file; another shape gets its own."""
    monkeypatch.setenv("MINIVLLM_GGUF_ZOO_DIR", str(tmp_path))
    written = []
    monkeypatch.setattr(
        gguf_zoo, "write_random_gguf", lambda p, f, s: written.append(p) or p.touch()
    )
    family = gguf_zoo.tiny(gguf_zoo.FAMILIES["llama-1b"])
    first = gguf_zoo.ensure_f16(family)
    assert gguf_zoo.ensure_f16(family) == first and len(written) == 1
    other = gguf_zoo.ensure_f16(gguf_zoo.tiny(gguf_zoo.FAMILIES["llama-3b"]))
    assert other.parent != first.parent and first.parent.parent == tmp_path


# -- the matrix's quiet runs and table ----------------------------------------
ROWS: dict[str, matrix.Row] = {
    "tg128": ("tg", 20.0, 10.0),
    "pg": ("pg", 40.0, 30.0),
    "seqs32": ("32", 100.0, 150.0),
}


def _loads(*values: float):
    it = iter(values)
    return lambda: next(it)


def test_busy_run_is_repeated_and_the_quieter_kept(tmp_path: Path) -> None:
    """1.5 cores busy on 2 threads is not quiet: the run is made again; the second,
    on 0.4, is kept and the row is quiet."""
    results = iter([{"tg128": ("tg", 1.0, 1.0)}, ROWS])
    run = matrix.MatrixRun("m", "Q4_0", tmp_path / "m.gguf")
    matrix.measure_quietly(
        run, lambda: next(results), threads=2, settle_s=0, probe=_loads(1.5, 0.4)
    )
    assert (run.load, run.quiet, run.repeated, run.rows) == (0.4, True, True, ROWS)


def test_busy_cores_reads_the_cpu_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the two readings of /proc/stat 1000 jiffies passed on 2 CPUs, 250 of
    them idle or waiting: 1.5 cores were busy (steal counts as busy)."""
    stat = tmp_path / "stat"
    lines = "cpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 1\n"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\n" + lines)

    def later(_: float) -> None:  # the second reading: +600 user, +150 steal, +250 idle
        stat.write_text("cpu  700 0 50 1000 100 0 0 150 0 0\n" + lines)

    assert matrix.busy_cores(1.0, stat, sleep=later) == pytest.approx(1.5)
    # no counters to read: the 1-minute load average stands in
    monkeypatch.setattr(matrix.os, "getloadavg", lambda: (0.75, 0.5, 0.25))
    assert matrix.busy_cores(0.0, tmp_path / "absent") == 0.75


def test_quiet_run_is_made_once_and_waiting_ends_when_load_falls(tmp_path: Path) -> None:
    calls, slept = [], []
    run = matrix.MatrixRun("m", "Q4_0", tmp_path / "m.gguf")
    matrix.measure_quietly(
        run,
        lambda: calls.append(1) or ROWS,
        threads=2,
        settle_s=60,
        probe=_loads(1.8, 1.2, 0.4),
        sleep=slept.append,
    )
    assert (len(calls), len(slept), run.load, run.quiet, run.repeated) == (1, 2, 0.4, True, False)


def test_table_marks_busy_and_failed_runs(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\0" * (3 << 20))
    busy = matrix.MatrixRun("qwen2-0.5b", "Q4_0", path, ROWS, load=1.7, quiet=False, repeated=True)
    failed = matrix.run_matrix(
        [("gemma3-1b", "Q8_0", path)],
        lambda p: (_ for _ in ()).throw(RuntimeError("llama-bench failed (1)")),
        threads=2,
        settle_s=0,
    )
    table = matrix.format_matrix([busy, *failed], seqs=32, serve=False)
    lines = table.splitlines()
    assert len(lines) == 5 and "serving" not in lines[0]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == [
        "qwen2-0.5b", "Q4_0", "3", "40.0 / 30.0", "0.75x", "20.0 / 10.0", "0.50x", "1.50x",
        "1.70", "**no** (best of 2)",
    ]  # fmt: skip
    assert (
        "failed" in lines[3]
        and lines[4] == "- gemma3-1b Q8_0: RuntimeError: llama-bench failed (1)"
    )
