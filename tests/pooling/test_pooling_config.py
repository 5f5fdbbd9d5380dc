"""runner / convert / pooler_config: resolved from the architecture as vLLM does,
and every refusal names the problem and the fix."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from minivllm import LLM
from minivllm.args.engine_args import EngineArgs
from minivllm.config.model import ModelConfig
from minivllm.config.pooler import PoolerConfig
from minivllm.pooling_params import PoolingParams
from tests.model_helpers import save_random_hf_model, write_gguf
from tests.pooling.pooling_helpers import save_bert, save_decoder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    save_bert(root / "bert")
    save_decoder(root / "qwen3")
    save_decoder(root / "cls", "Qwen2ForSequenceClassification", "Qwen2Config", num_labels=2)
    save_random_hf_model(root / "llama")
    return {name: str(root / name) for name in ("bert", "qwen3", "cls", "llama")}


@pytest.mark.parametrize(
    ("name", "kwargs", "runner", "convert", "pooling"),
    [
        ("bert", {}, "pooling", "embed", "CLS"),
        ("qwen3", {}, "pooling", "embed", "LAST"),
        ("cls", {}, "pooling", "classify", "LAST"),
        ("llama", {}, "generate", "none", None),
        ("llama", {"runner": "pooling"}, "pooling", "embed", "LAST"),
        ("llama", {"convert": "embed"}, "pooling", "embed", "LAST"),
        ("cls", {"convert": "embed"}, "pooling", "embed", "LAST"),
        ("bert", {"pooler_config": {"pooling_type": "MEAN"}}, "pooling", "embed", "MEAN"),
    ],
)
def test_runner_and_convert_from_the_architecture(
    models: dict[str, str], name: str, kwargs: dict, runner: str, convert: str, pooling: str | None
) -> None:
    config = EngineArgs(model=models[name], **kwargs).create_engine_config()
    model = config.model_config
    assert (model.runner_type, model.convert_type) == (runner, convert)
    assert (model.pooler_config and model.pooler_config.pooling_type) == pooling
    if pooling is not None:
        assert model.pooler_config.normalize == (convert == "embed")
    # Prefix caching stays on only where it is valid: causal + LAST pooling, or generation.
    assert config.cache_config.enable_prefix_caching == (pooling in ("LAST", None))


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("bert", {"runner": "generate"}, "--runner pooling"),
        ("llama", {"convert": "classify"}, "classification head"),
        ("llama", {"pooler_config": {"normalize": False}}, "pooling models only"),
        ("bert", {"pooler_config": {"pooling_type": "STEP"}}, "process reward"),
        ("bert", {"pooler_config": {"step_tag_id": 3}}, "process reward"),
        ("bert", {"pooler_config": {"pooling_type": "MAX"}}, "pooling_type"),
        ("bert", {"pooler_config": {"dimensions": 65}}, "hidden size 64"),
        ("bert", {"pooler_config": {"max_embed_len": 0}}, "max_embed_len must be >= 1"),
        (
            "bert",
            {"pooler_config": {"enable_chunked_processing": True, "pooling_type": "ALL"}},
            "ALL pooling",
        ),
        ("bert", {"enable_prefix_caching": True}, "prefix caching"),
        (
            "qwen3",
            {"enable_prefix_caching": True, "pooler_config": {"pooling_type": "MEAN"}},
            "MEAN",
        ),
        ("bert", {"runner": "draft"}, "draft"),
    ],
)
def test_refusals_say_why(models: dict[str, str], name: str, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=models[name], **kwargs).create_engine_config()


def test_compile_hashes(models: dict[str, str]) -> None:
    # The pooler runs after the compiled model; the runner changes the model (no LM head).
    assert PoolerConfig().compute_hash() == PoolerConfig(normalize=False).compute_hash()
    generate = ModelConfig(model=models["llama"]).compute_hash()
    assert ModelConfig(model=models["llama"], runner="pooling").compute_hash() != generate


def test_gguf_pooling_metadata_makes_an_embedding_model(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "plain.gguf", "qwen3")
    assert ModelConfig(model=str(path)).runner_type == "generate"
    # The same file declaring llama.cpp's LAST pooling (3), as embedding GGUFs do.
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "embed.gguf"), "qwen3")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    writer.add_uint32("qwen3.pooling_type", 3)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = ModelConfig(model=str(tmp_path / "embed.gguf"))
    assert (model.runner_type, model.convert_type) == ("pooling", "embed")
    assert model.pooler_config.pooling_type == "LAST"


@pytest.fixture(scope="module")
def bert_llm(models: dict[str, str]) -> LLM:
    return LLM(models["bert"], dtype="float32", optimization_level=0, max_model_len=32)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda llm: llm.embed(""), "input is empty"),
        (lambda llm: llm.embed([]), None),
        (lambda llm: llm.embed("the " * 40), "42 tokens.*enable_chunked_processing"),
        (lambda llm: llm.embed("the cat", PoolingParams(dimensions=65)), "dimensions=65"),
        (lambda llm: llm.classify("the cat"), "does not serve the 'classify' task"),
        (lambda llm: llm.embed([999]), "out of vocabulary"),
    ],
)
def test_bad_pooling_input(bert_llm: LLM, call, match: str | None) -> None:
    if match is None:
        assert call(bert_llm) == []  # nothing to embed, nothing returned (as vLLM)
        return
    with pytest.raises(ValueError, match=match):
        call(bert_llm)
    assert not bert_llm.llm_engine.has_unfinished_requests()


def test_truncate_prompt_tokens_keeps_the_last_tokens(bert_llm: LLM) -> None:
    tokens = bert_llm.get_tokenizer()("the cat " * 30)["input_ids"]
    out = bert_llm.embed({"prompt_token_ids": tokens}, PoolingParams(truncate_prompt_tokens=-1))
    assert out[0].prompt_token_ids == tokens[-32:]


def test_a_generation_model_refuses_embeddings(models: dict[str, str]) -> None:
    llm = LLM(models["llama"], skip_tokenizer_init=True, optimization_level=0)
    with pytest.raises(ValueError, match="--runner pooling"):
        llm.embed([[1, 2, 3]])
