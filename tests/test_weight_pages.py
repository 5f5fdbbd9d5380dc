"""A CPU model's weights moved onto transparent huge pages after loading
(`minivllm.worker.weight_pages`): the same values in one huge-page arena, every
reference to them moved along, tensors mapped from a file left in place, and the
old memory released."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from minivllm.kernels import lowbit_cpu
from minivllm.worker.weight_pages import huge_pages_mode, mapping_fields, place_on_huge_pages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux's transparent huge pages")


def _mapping_of(ptr: int) -> dict[str, str]:
    fields = mapping_fields(ptr)
    assert fields, hex(ptr)
    return fields


class Toy(nn.Module):
    """Weights laid out the ways a loaded model has them: a plain parameter, a
    parameter tied between two modules, buffers that are views of one stacked
    storage, a plain attribute viewing a buffer, and a table mapped from a file."""

    def __init__(self, table_file: Path) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 48, bias=True)
        self.embed = nn.Embedding(32, 64)
        self.head = nn.Linear(64, 32, bias=False)
        self.head.weight = self.embed.weight  # tied
        stacked = torch.arange(3 * 4096, dtype=torch.float32)
        self.register_buffer("q", stacked[:4096].view(64, 64))
        self.register_buffer("kv", stacked[4096:].view(2, 64, 64))
        self.q_rows = self.q[8:16]  # a view kept beside the buffer
        torch.arange(1 << 16, dtype=torch.uint8).numpy().tofile(table_file)
        self.register_buffer(
            "table", torch.from_file(str(table_file), shared=True, size=1 << 16, dtype=torch.uint8)
        )
        for p in self.parameters():
            p.requires_grad_(False)


@pytest.fixture
def toy(tmp_path: Path) -> Toy:
    return Toy(tmp_path / "table.bin")


def test_weights_move_into_one_arena_with_their_values_and_ties(toy: Toy, monkeypatch) -> None:
    monkeypatch.setenv("MINIVLLM_CPU_HUGE_PAGES", "1")
    if huge_pages_mode() in ("", "never"):
        placement = place_on_huge_pages(toy)
        assert placement.moved_bytes == 0 and "transparent huge pages" in placement.reason
        return
    before = {name: t.clone() for name, t in toy.state_dict().items()}
    toy.proj.weight.output_dim = 0
    table_ptr = toy.table.untyped_storage().data_ptr()
    placement = place_on_huge_pages(toy)
    # Four storages move (proj.weight, proj.bias, the tied table, the stacked q/kv);
    # the file's table stays the file's pages.
    assert placement.moved_storages == 4 and placement.left_storages == 1
    assert placement.still_held_bytes == 0
    assert toy.table.untyped_storage().data_ptr() == table_ptr
    moved = [toy.proj.weight, toy.proj.bias, toy.embed.weight, toy.q, toy.kv, toy.q_rows]
    mappings = [_mapping_of(t.data_ptr()) for t in moved]
    assert len({m["range"] for m in mappings}) == 1, "every moved tensor lives in one arena"
    assert "hg" in mappings[0]["VmFlags"].split(), mappings[0]  # advised for huge pages
    # Each old storage is a storage of its own again: compilers take tensors that
    # share one for possible aliases.
    storages = {t.untyped_storage().data_ptr() for t in moved}
    assert len(storages) == 4
    assert toy.q.untyped_storage().data_ptr() == toy.kv.untyped_storage().data_ptr()
    assert toy.proj.weight.output_dim == 0  # an attribute a loader set on the weight
    for name, t in toy.state_dict().items():
        assert torch.equal(t, before[name]), name
    assert isinstance(toy.proj.weight, nn.Parameter) and toy.head.weight is toy.embed.weight
    # The view kept beside its buffer still aliases it, and q and kv still share bytes.
    toy.q[8, 0] = -1.0
    assert toy.q_rows[0, 0] == -1.0
    assert toy.kv.data_ptr() == toy.q.data_ptr() + 4096 * 4


def test_a_view_held_outside_the_model_is_reported_as_kept_twice(toy: Toy, monkeypatch) -> None:
    if huge_pages_mode() in ("", "never"):
        pytest.skip("this kernel has transparent huge pages off: nothing moves")
    monkeypatch.setenv("MINIVLLM_CPU_HUGE_PAGES", "1")
    outside = toy.kv[1]  # e.g. a cache some object outside the modules keeps
    nbytes = outside.untyped_storage().nbytes()
    placement = place_on_huge_pages(toy)
    assert placement.still_held_bytes == nbytes
    assert outside.untyped_storage().data_ptr() != toy.kv.untyped_storage().data_ptr()


def test_switched_off_by_the_environment(toy: Toy, monkeypatch) -> None:
    monkeypatch.setenv("MINIVLLM_CPU_HUGE_PAGES", "0")
    ptr = toy.proj.weight.data_ptr()
    placement = place_on_huge_pages(toy)
    assert placement.moved_bytes == 0 and placement.reason == "MINIVLLM_CPU_HUGE_PAGES=0"
    assert toy.proj.weight.data_ptr() == ptr


ENGINE = """
import json
from minivllm import LLM, SamplingParams
from minivllm.kernels import lowbit_cpu
from minivllm.worker.weight_pages import mapping_fields
llm = LLM(max_num_seqs=4)
model = llm.llm_engine.executor.worker.model_runner.model
fields = mapping_fields(model.model.layers[0].self_attn.qkv_proj.qweight.data_ptr())
flags = fields["VmFlags"]
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
tokens = [o.outputs[0].token_ids for o in outs]
kib = {k: int(fields[k].split()[0]) for k in ("Rss", "AnonHugePages")}
huge = kib["AnonHugePages"] >= 0.9 * kib["Rss"]
print(json.dumps({"flags": flags, "tokens": tokens, "prefetch": lowbit_cpu.prefetch(), "huge": huge}))
"""


def _engine_run(huge: str) -> dict:
    import json

    env = {**os.environ, "MINIVLLM_CPU_HUGE_PAGES": huge}
    out = subprocess.run(
        [sys.executable, "-c", ENGINE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_engine_decodes_from_huge_pages_with_the_same_tokens() -> None:
    """A CPU worker moves the default model's weights before its decode graph binds
    them, and greedy tokens (compiled prefill, the decode graph's fused layers) are
    those of the weights left where loading put them."""
    on, off = _engine_run("1"), _engine_run("0")
    if huge_pages_mode() not in ("", "never"):
        assert "hg" in on["flags"].split(), on["flags"]
    assert "hg" not in off["flags"].split()
    assert on["tokens"] == off["tokens"]
    # The kernels' software prefetch is for weights in 4 KiB pages only.
    assert off["prefetch"] == lowbit_cpu.DEFAULT_PREFETCH and not off["huge"]
    assert on["prefetch"] == (0 if on["huge"] else lowbit_cpu.DEFAULT_PREFETCH)


def test_prefetching_changes_no_result() -> None:
    """The kernels' prefetch distance is a hint only: every distance gives the same
    bits, on the q4 forms and the tiled int8 head alike."""
    if not lowbit_cpu.available():
        pytest.skip("no C++ compiler here")
    gen = torch.Generator().manual_seed(0)
    n, k = 64, 512
    q = torch.randint(0, 16, (n, k), generator=gen)
    d = torch.rand(n, k // 256, generator=gen) * 0.01
    sc = torch.randint(0, 64, (n, k // 32), generator=gen)
    w4, s4 = lowbit_cpu.pack_q4_super(q, d, d / 2, sc, sc.flip(1))
    tiles = lowbit_cpu.pack_q8_tiles(
        torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    )
    row = torch.rand(n, generator=gen) * 0.01
    xs = [torch.randn(m, k, generator=gen) for m in (1, 5)]  # one token; a tile and one
    before = lowbit_cpu.prefetch()
    try:
        outs = []
        for ahead in (0, 64, 2048, 8192):
            assert lowbit_cpu.prefetch(ahead) == ahead
            outs.append(
                [torch.ops.minivllm_cpu.q4_gemm(x, w4, s4) for x in xs]
                + [torch.ops.minivllm_cpu.q8_tiled_gemm(x, tiles, row, 2) for x in xs]
            )
        for got in outs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(got, outs[0], strict=True))
        with pytest.raises(RuntimeError, match="at most 1 MiB ahead"):
            lowbit_cpu.prefetch(1 << 21)
    finally:
        lowbit_cpu.prefetch(before)
