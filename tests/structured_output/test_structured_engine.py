"""Structured outputs end to end in the offline engine with the default model.

The model is small and weak; the grammar keeps every output valid regardless, which is
what these tests check: JSON schemas (validated with the ``jsonschema`` library), regex
and choice (exact), also when requests are preempted and recomputed, with n > 1, and
after prefix-cache hits.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from structured_schemas import SCHEMAS

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import StructuredOutputsParams

# The tiny model, left free to put whitespace between JSON tokens, often pads with it
# until max_tokens; without free whitespace every answer is short and finishes.
# float32: a greedy row then picks the same tokens in any batch (the unconstrained row
# of test_one_batch_of_every_kind is compared with its run alone).
COMMON: dict[str, Any] = dict(
    dtype="float32",
    optimization_level=0,
    structured_outputs_config={"disable_any_whitespace": True},
)
PROMPTS = [
    "Describe a person as JSON.",
    "Write some JSON data.",
    "Give me a JSON document.",
    "Output JSON now:",
    "Here is the data you asked for:",
]


def _json(schema: dict[str, Any], seed: int, **kwargs: Any) -> SamplingParams:
    return SamplingParams(
        temperature=0.8,
        seed=seed,
        max_tokens=kwargs.pop("max_tokens", 120),
        structured_outputs=StructuredOutputsParams(json=schema),
        **kwargs,
    )


def _valid(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(max_model_len=512, num_gpu_blocks_override=320, **COMMON)


@pytest.mark.slow  # test_one_batch_of_every_kind covers it: one generation per schema
def test_fifty_generations_over_ten_schemas_are_all_valid(llm: LLM) -> None:
    # One batch of 50: every row constrained by its own grammar (5 per schema).
    prompts = [PROMPTS[i % 5] for i in range(50)]
    params = [_json(SCHEMAS[i // 5], seed=i) for i in range(50)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        _valid(completion.text, SCHEMAS[i // 5])
    # Sampling still samples: the five generations of a schema are not all one text.
    assert len({o.outputs[0].text for o in outputs[:5]}) > 1


def test_one_batch_of_every_kind(llm: LLM) -> None:
    """One batch: each of the ten schemas, a regex, a choice, any JSON object, a grammar,
    and an unconstrained greedy row, which must come out as it does alone."""
    regex = r"[A-Z][a-z]{2,6}-[0-9]{3}"
    choices = ["alpha", "beta gamma", 'quote " and \\ slash']
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    others = [
        StructuredOutputsParams(regex=regex),
        StructuredOutputsParams(choice=choices),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(grammar=grammar),
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    params = [_json(schema, seed=i) for i, schema in enumerate(SCHEMAS)]
    # Sampled freely, "any JSON object" may open a key string and never close it, so
    # that row is greedy.
    params += [
        SamplingParams(
            temperature=0.0 if k.json_object else 1.0, seed=i, max_tokens=60, structured_outputs=k
        )
        for i, k in enumerate(others)
    ]
    params.append(greedy)
    prompts = [PROMPTS[i % 5] for i in range(len(params))]
    [alone] = llm.generate(prompts[-1:], greedy, use_tqdm=False)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outputs]
    for text, output, schema in zip(texts, outputs, SCHEMAS, strict=False):
        assert output.outputs[0].finish_reason == "stop", text
        _valid(text, schema)
    regex_text, choice_text, object_text, grammar_text = texts[10:14]
    assert re.fullmatch(regex, regex_text), regex_text
    assert choice_text in choices
    assert isinstance(json.loads(object_text), dict)
    assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", grammar_text), grammar_text
    assert outputs[-1].outputs[0].token_ids == alone.outputs[0].token_ids


def test_invalid_constraints_are_refused_when_added(llm: LLM) -> None:
    bad = [
        (StructuredOutputsParams(regex="[a-"), "invalid regex"),
        (StructuredOutputsParams(json={"type": "object", "required": 5}), "invalid JSON schema"),
        (StructuredOutputsParams(json="{not json"), "not valid JSON"),
        (StructuredOutputsParams(grammar='root ::= "a" |'), "invalid grammar"),
    ]
    for constraint, words in bad:
        with pytest.raises(ValueError, match=words):
            llm.generate("x", SamplingParams(structured_outputs=constraint), use_tqdm=False)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_grammars_compile_once(llm: LLM) -> None:
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    manager = llm.llm_engine.structured_outputs
    first = manager.grammar_for(StructuredOutputsParams(json=schema))
    compiles = manager.num_compiles
    # The same schema again (as a new dict, or as its text) is a cache hit.
    again = StructuredOutputsParams(json=json.loads(json.dumps(schema)))
    assert manager.grammar_for(again) is first
    assert manager.grammar_for(StructuredOutputsParams(json=json.dumps(schema))) is first
    assert manager.num_compiles == compiles
    # Different options make a different grammar.
    tight = StructuredOutputsParams(json=schema, disable_additional_properties=True)
    assert manager.grammar_for(tight) is not first
    assert manager.num_compiles == compiles + 1


def test_constraints_hold_through_preemption_n_and_prefix_hits() -> None:
    # 12 blocks of 16 tokens: six requests of ~70 tokens cannot all fit, so the
    # scheduler preempts some mid-answer; they are recomputed with their tokens so far,
    # and the matcher is replayed over them (restarting it would break the JSON).
    small = LLM(max_model_len=112, num_gpu_blocks_override=8, block_size=16, **COMMON)
    schema = SCHEMAS[3]
    params = [_json(schema, seed=i, max_tokens=90) for i in range(2)]
    params.append(_json(schema, seed=9, max_tokens=90, n=2))
    # The same prompt for all: later admissions hit the prefix cache.
    outputs = small.generate([PROMPTS[0]] * 3, params, use_tqdm=False)
    assert small.llm_engine.get_stats().num_preemptions > 0
    completions = [c for o in outputs for c in o.outputs]
    assert len(completions) == 4
    for completion in completions:
        assert completion.finish_reason == "stop", completion.text
        _valid(completion.text, schema)
    manager = small.llm_engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
