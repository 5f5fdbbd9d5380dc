"""The AOT-compiled forward: a second start loads Dynamo's saved trace instead of
tracing, and a trace that no longer fits its sources (or cannot be read) is redone."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from compile_helpers import greedy_tokens, make_llm, start

from minivllm.compilation.aot import AOT_FILE, SOURCES_FILE, TENSORS_KEY
from minivllm.compilation.cache import PIECES_FILE

INDUCTOR = {"mode": "VLLM_COMPILE", "backend": "inductor"}

needs_aot_api = pytest.mark.skipif(
    not hasattr(torch.compile(lambda: None), "aot_compile"),
    reason=f"torch {torch.__version__} has no AOT compile API (torch.compile(...).aot_compile)",
)
"""For the tests of saving and loading: a torch without the API never saves a trace."""


@pytest.fixture(scope="module")
def first_start(one_layer_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A cold start with a fresh cache root, and the eager engine's tokens."""
    root = tmp_path_factory.mktemp("aot_root")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIVLLM_CACHE_ROOT", str(root))
        eager = greedy_tokens(make_llm(one_layer_llama, compilation_config={"mode": 0}))
        llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
        cache_dir = Path(llm.llm_engine.vllm_config.compilation_config.local_cache_dir)
        tokens = greedy_tokens(llm)
    return dict(root=root, cache_dir=cache_dir, eager=eager, counts=counts, tokens=tokens)


def copy_root(first: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the first start's cache root, made the current one; returns
    the copy's directory of the model's compiled artifacts."""
    root = tmp_path / "root"
    shutil.copytree(first["root"], root)
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(root))
    return root / first["cache_dir"].relative_to(first["root"])


@needs_aot_api
def test_first_start_traces_and_saves_the_trace(first_start: dict[str, Any]) -> None:
    counts = first_start["counts"]
    assert counts["num_dynamo_traces"] == 1 and counts["num_aot_saves"] == 1
    assert counts.get("num_aot_loads", 0) == 0
    assert (first_start["cache_dir"] / AOT_FILE).is_file()
    sources = json.loads((first_start["cache_dir"] / SOURCES_FILE).read_text())
    assert {"minivllm.model_executor.models.llama", "minivllm.attention.layer"} <= set(sources)
    assert first_start["tokens"] == first_start["eager"]


@needs_aot_api
def test_second_start_loads_the_trace_and_compiles_nothing(
    one_layer_llama: Path, first_start: dict[str, Any], tmp_path: Path, monkeypatch: Any
) -> None:
    copy_root(first_start, tmp_path, monkeypatch)
    llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert counts.get("num_dynamo_traces", 0) == 0 and counts["num_aot_loads"] == 1
    # The loaded graph splits into the same pieces the first start compiled, installed
    # from the entries it recorded (no run on fake inputs).
    assert counts.get("num_backend_compilations", 0) == 0 and counts["num_cache_loads"] == 2
    assert counts.get("num_shape_runs", 0) == 0
    assert greedy_tokens(llm) == first_start["eager"]


@needs_aot_api
@pytest.mark.parametrize("damage", ["artifact", "record", "unreadable"])
def test_recorded_pieces_are_used_only_when_all_are_cached(
    one_layer_llama: Path,
    first_start: dict[str, Any],
    tmp_path: Path,
    monkeypatch: Any,
    damage: str,
) -> None:
    """A missing artifact, a record naming an entry that is not there, or an unreadable
    record: the start runs the graph on fake inputs and compiles what is missing."""
    assert first_start["counts"]["num_shape_runs"] >= 1
    cache_dir = copy_root(first_start, tmp_path, monkeypatch)
    pieces_file = cache_dir / PIECES_FILE
    recorded = json.loads(pieces_file.read_text())
    assert len(recorded) == 1
    (pieces,) = recorded.values()
    assert len(pieces) == 2 and all(len(p["keys"]) >= 1 for p in pieces.values())
    if damage == "artifact":
        index = json.loads((cache_dir / "cache_index.json").read_text())
        key = next(iter(pieces.values()))["keys"][0]
        artifact = cache_dir / index[key]
        shutil.rmtree(artifact) if artifact.is_dir() else artifact.unlink()
    elif damage == "record":
        for piece in pieces.values():
            piece["keys"] = ["0" * 24 for _ in piece["keys"]]
        pieces_file.write_text(json.dumps(recorded))
    else:
        pieces_file.write_text("{not json")
    llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert counts["num_shape_runs"] == 1 and counts.get("num_dynamo_traces", 0) == 0
    assert counts.get("num_inductor_compilations", 0) == (1 if damage == "artifact" else 0)
    assert greedy_tokens(llm) == first_start["eager"]
    del llm
    # The run wrote a good record again: the next start uses it.
    _, again, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert again.get("num_shape_runs", 0) == 0 and again["num_cache_loads"] == 2


@needs_aot_api
@pytest.mark.parametrize(
    "entry",
    # as if llama.py was edited; as if the weights took another form (shape or dtype)
    ["minivllm.model_executor.models.llama", TENSORS_KEY],
)
def test_changed_source_or_weights_trace_again(
    one_layer_llama: Path, first_start: dict[str, Any], tmp_path: Path, monkeypatch: Any, entry: str
) -> None:
    cache_dir = copy_root(first_start, tmp_path, monkeypatch)
    sources_file = cache_dir / SOURCES_FILE
    sources = json.loads(sources_file.read_text())
    true_hash = sources[entry]
    sources[entry] = "0" * 64
    sources_file.write_text(json.dumps(sources))
    llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert counts["num_dynamo_traces"] == 1 and counts.get("num_aot_loads", 0) == 0
    assert counts["num_aot_saves"] == 1
    assert json.loads(sources_file.read_text())[entry] == true_hash
    assert greedy_tokens(llm) == first_start["eager"]


@needs_aot_api
def test_unreadable_trace_is_a_miss(
    one_layer_llama: Path,
    first_start: dict[str, Any],
    tmp_path: Path,
    monkeypatch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_dir = copy_root(first_start, tmp_path, monkeypatch)
    (cache_dir / AOT_FILE).write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING):
        llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert any("could not load" in r.getMessage() for r in caplog.records)
    assert counts["num_dynamo_traces"] == 1 and counts["num_aot_saves"] == 1
    assert greedy_tokens(llm) == first_start["eager"]


@needs_aot_api
@pytest.mark.parametrize(
    ("env", "extra"),
    [("0", {}), ("1", {"dynamic_shapes_config": {"evaluate_guards": True}})],
    ids=["env-off", "evaluate-guards"],
)
def test_aot_can_be_turned_off(
    one_layer_llama: Path,
    first_start: dict[str, Any],
    tmp_path: Path,
    monkeypatch: Any,
    env: str,
    extra: dict[str, Any],
) -> None:
    """``MINIVLLM_USE_AOT_COMPILE=0`` ignores the saved trace; evaluate_guards (whose
    guards a saved trace would drop) never saves one."""
    copy_root(first_start, tmp_path, monkeypatch)
    monkeypatch.setenv("MINIVLLM_USE_AOT_COMPILE", env)
    llm, counts, _ = start(one_layer_llama, compilation_config={**INDUCTOR, **extra})
    assert counts["num_dynamo_traces"] == 1
    assert counts.get("num_aot_loads", 0) == 0 and counts.get("num_aot_saves", 0) == 0
    cache_dir = Path(llm.llm_engine.vllm_config.compilation_config.local_cache_dir)
    if extra:
        assert not (cache_dir / AOT_FILE).exists()
    assert greedy_tokens(llm) == first_start["eager"]


@needs_aot_api
def test_pieces_missing_from_the_cache_are_compiled_and_saved_on_load(
    one_layer_llama: Path, first_start: dict[str, Any], tmp_path: Path, monkeypatch: Any
) -> None:
    """The trace loads, the pieces it needs are compiled (no Dynamo) and cached."""
    cache_dir = copy_root(first_start, tmp_path, monkeypatch)
    for path in cache_dir.iterdir():
        if path.name not in (AOT_FILE, SOURCES_FILE):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert counts.get("num_dynamo_traces", 0) == 0 and counts["num_aot_loads"] == 1
    assert counts["num_inductor_compilations"] == 2 and counts["num_cache_saves"] == 2
    assert greedy_tokens(llm) == first_start["eager"]
    del llm
    _, again, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert again.get("num_backend_compilations", 0) == 0 and again["num_cache_loads"] == 2


@needs_aot_api
def test_compile_sizes_are_cached_with_a_loaded_trace(
    one_layer_llama: Path, first_start: dict[str, Any], tmp_path: Path, monkeypatch: Any
) -> None:
    """A compile size's static pieces, compiled at warm-up from the loaded graph, are
    saved and loaded like the rest."""
    copy_root(first_start, tmp_path, monkeypatch)
    sized = {**INDUCTOR, "compile_sizes": [4]}
    _, first, _ = start(one_layer_llama, compilation_config=sized)  # a new config hash
    assert first["num_dynamo_traces"] == 1 and first["num_cache_saves"] == 4
    llm, second, _ = start(one_layer_llama, compilation_config=sized)
    assert second.get("num_dynamo_traces", 0) == 0 and second["num_aot_loads"] == 1
    assert second.get("num_backend_compilations", 0) == 0 and second["num_cache_loads"] == 4
    assert greedy_tokens(llm) == first_start["eager"]


def _compile_without_aot_api(real_compile: Any) -> Any:
    """torch.compile as in a torch release without the AOT API (no ``aot_compile``)."""

    def compile_(fn: Any, **kwargs: Any) -> Any:
        compiled = real_compile(fn, **kwargs)
        return lambda *args, **kw: compiled(*args, **kw)

    return compile_


def _compile_whose_aot_fails(real_compile: Any) -> Any:
    """torch.compile whose ``aot_compile`` raises (a graph Dynamo cannot save)."""

    def compile_(fn: Any, **kwargs: Any) -> Any:
        compiled = real_compile(fn, **kwargs)

        def call(*args: Any, **kw: Any) -> Any:
            return compiled(*args, **kw)

        def aot_compile(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("cannot AOT-compile this graph")

        call.aot_compile = aot_compile  # type: ignore[attr-defined]
        return call

    return compile_


@pytest.mark.parametrize("torch_compile", [_compile_without_aot_api, _compile_whose_aot_fails])
def test_without_aot_the_forward_traces_as_usual(
    one_layer_llama: Path,
    first_start: dict[str, Any],
    tmp_path: Path,
    monkeypatch: Any,
    torch_compile: Any,
) -> None:
    """Found on a torch without the AOT API: the fallback trace must not see a graph
    whose metadata the AOT save stripped (Dynamo failed with KeyError 'grapharg')."""
    import torch

    from minivllm.compilation import wrapper

    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path / "root"))
    monkeypatch.setattr(wrapper.torch, "compile", torch_compile(torch.compile))
    llm, counts, _ = start(one_layer_llama, compilation_config=INDUCTOR)
    assert counts["num_dynamo_traces"] == 1
    assert counts.get("num_aot_saves", 0) == 0 and counts.get("num_aot_loads", 0) == 0
    assert greedy_tokens(llm) == first_start["eager"]


@pytest.fixture(scope="module", params=["Q8_0", "Q4_1"])
def tiny_lowbit_gguf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A 1-layer Llama GGUF whose every matrix (embedding and LM head too) is Q8_0,
    or, as in the default model, whose layer matrices are Q4_1 (run as int4, packed
    into views of a larger tensor)."""
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_tiny_gguf

    path = tmp_path_factory.mktemp("lowbit_gguf") / f"tiny-{request.param}.gguf"
    layer_type = None if request.param == "Q8_0" else GGMLQuantizationType[request.param]
    write_tiny_gguf(str(path), tie=False, num_layers=1, all_q8_0=True, layer_type=layer_type)
    return path


@needs_aot_api
def test_gguf_quantized_second_start_loads_the_trace(
    tiny_lowbit_gguf: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """``quantization="gguf"`` saves and loads the trace like the float path (the
    quantized lookup tables reached Dynamo as views, which it could not pickle)."""
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path / "root"))
    opts: dict[str, Any] = dict(quantization="gguf", max_model_len=128)
    eager = greedy_tokens(make_llm(tiny_lowbit_gguf, compilation_config={"mode": 0}, **opts))
    llm, first, _ = start(tiny_lowbit_gguf, compilation_config=INDUCTOR, **opts)
    assert first["num_dynamo_traces"] == 1 and first["num_aot_saves"] == 1
    assert greedy_tokens(llm) == eager
    del llm
    llm, second, _ = start(tiny_lowbit_gguf, compilation_config=INDUCTOR, **opts)
    assert second.get("num_dynamo_traces", 0) == 0 and second["num_aot_loads"] == 1
    assert second.get("num_backend_compilations", 0) == 0
    assert greedy_tokens(llm) == eager
