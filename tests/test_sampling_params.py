"""SamplingParams: defaults, normalisation, validation, stop-token bookkeeping."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minivllm.sampling_params import RequestOutputKind, SamplingParams, SamplingType


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.max_tokens == 16 and p.min_tokens == 0
    assert p.stop == [] and p.stop_token_ids == [] and p.all_stop_token_ids == set()
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.detokenize and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.include_stop_str_in_output and not p.ignore_eos
    assert p.output_kind is RequestOutputKind.CUMULATIVE
    assert p.sampling_type is SamplingType.RANDOM


def test_module_does_not_import_torch() -> None:
    # The scheduler imports SamplingParams and must stay torch-free.
    code = "import sys, minivllm.sampling_params, minivllm.outputs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_normalisation() -> None:
    p = SamplingParams(stop="###", top_k=-1, seed=-1, logprobs=True, stop_token_ids=(5, 6))
    assert p.stop == ["###"] and p.top_k == 0 and p.seed is None and p.logprobs == 1
    assert p.stop_token_ids == [5, 6] and p.all_stop_token_ids == {5, 6}
    assert SamplingParams(logprobs=False).logprobs is None
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA


def test_sampling_type() -> None:
    assert SamplingParams(temperature=0).sampling_type is SamplingType.GREEDY
    assert SamplingParams(temperature=0.7, seed=1).sampling_type is SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.7).sampling_type is SamplingType.RANDOM


def test_greedy_resets_truncation_knobs() -> None:
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=10, min_p=0.2)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)


def test_tiny_temperature_is_raised() -> None:
    assert SamplingParams(temperature=1e-4).temperature == pytest.approx(1e-2)


def test_stop_buffer_length() -> None:
    assert SamplingParams(stop=["ab", "xyz1"]).output_text_buffer_length == 3
    kept = SamplingParams(stop=["ab", "xyz1"], include_stop_str_in_output=True)
    assert kept.output_text_buffer_length == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logprobs": -2}, "logprobs"),
        ({"prompt_logprobs": -5}, "prompt_logprobs"),
        ({"stop_token_ids": [3, -1]}, "stop_token_ids"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": "x", "detokenize": False}, "detokenize"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"temperature": 0, "n": 2}, "n must be 1"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_boundary_values_are_accepted() -> None:
    SamplingParams(top_p=1e-6, min_p=1.0, presence_penalty=-2, frequency_penalty=2)
    SamplingParams(min_tokens=4, max_tokens=4, logprobs=-1, prompt_logprobs=0)
    SamplingParams(max_tokens=None, min_tokens=100)


def test_verify_for_model() -> None:
    SamplingParams(logprobs=20).verify_for_model(vocab_size=100)
    with pytest.raises(ValueError, match="at most 20"):
        SamplingParams(logprobs=21).verify_for_model(vocab_size=100)
    with pytest.raises(ValueError, match="at most 20"):
        SamplingParams(prompt_logprobs=-1).verify_for_model(vocab_size=100)
    # A cap of -1 allows the whole vocabulary.
    SamplingParams(logprobs=-1).verify_for_model(vocab_size=100, max_logprobs=-1)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[1, 100]).verify_for_model(vocab_size=100)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={100: 1.0}).verify_for_model(vocab_size=100)


def test_eos_updates() -> None:
    p = SamplingParams(stop_token_ids=[7])
    p.update_from_tokenizer(2)
    assert p.all_stop_token_ids == {2, 7} and p.stop_token_ids == [7]
    p.update_from_generation_config({"eos_token_id": [2, 9]}, model_eos_token_id=2)
    # The extra generation-config EOS becomes a visible stop token; the model EOS does not.
    assert p.all_stop_token_ids == {2, 7, 9} and p.stop_token_ids == [7, 9]

    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({"eos_token_id": 9}, model_eos_token_id=2)
    assert ignoring.all_stop_token_ids == {2, 9} and ignoring.stop_token_ids == []


def test_clone_is_independent() -> None:
    p = SamplingParams(stop=["a"], logit_bias={1: 2.0})
    q = p.clone()
    q.update_from_tokenizer(5)
    q.stop.append("b")  # type: ignore[union-attr]
    assert p.all_stop_token_ids == set() and p.stop == ["a"]
    assert q == SamplingParams(stop=["a", "b"], logit_bias={1: 2.0}, _all_stop_token_ids={5})


def test_repr_shows_only_non_defaults() -> None:
    text = repr(SamplingParams(temperature=0.5, max_tokens=3))
    assert text == "SamplingParams(temperature=0.5, max_tokens=3)"


# --- minivllm.outputs (torch-free too, so its tests live here) ---


def test_make_logprobs_dict_like_vllm() -> None:
    from minivllm.outputs import Logprob, make_logprobs_dict

    # Sampled token 7 ranked 3rd; the batch computed top-3 but this request asked for 2.
    got = make_logprobs_dict(7, -2.0, 3, [4, 5, 7], [-0.5, -1.0, -2.0], 2, decode=str)
    assert got == {
        7: Logprob(-2.0, 3, "7"),
        4: Logprob(-0.5, 1, "4"),
        5: Logprob(-1.0, 2, "5"),
    }
    # The sampled token among the top-k appears once.
    assert list(make_logprobs_dict(4, -0.5, 1, [4, 5], [-0.5, -1.0], 2)) == [4, 5]
    assert make_logprobs_dict(4, -0.5, 1, [4, 5], [-0.5, -1.0], 0) == {4: Logprob(-0.5, 1)}


def test_request_output_add_and_repr() -> None:
    from minivllm.outputs import CompletionOutput, RequestOutput

    def out(text: str, ids: list[int], finished: bool) -> RequestOutput:
        completion = CompletionOutput(0, text, ids, None, None, "stop" if finished else None)
        return RequestOutput("r1", "p", [1], None, [completion], finished)

    total = out("Hel", [5], False)
    total.add(out("lo", [6], True), aggregate=True)
    assert total.finished and total.outputs[0].text == "Hello"
    assert total.outputs[0].token_ids == [5, 6] and total.outputs[0].finished()
    replaced = out("Hel", [5], False)
    replaced.add(out("Hello", [5, 6], False), aggregate=False)
    assert replaced.outputs[0].text == "Hello" and not replaced.finished
    assert "RequestOutput(request_id=r1" in repr(total) and "text='Hello'" in repr(total)


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", float("inf")),
        ("temperature", 1e39),
        ("temperature", float("nan")),
        ("top_p", float("nan")),
        ("min_p", float("nan")),
        ("presence_penalty", float("-inf")),
        ("frequency_penalty", float("nan")),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", 1e-30),
        ("logit_bias", {3: float("inf")}),
        ("logit_bias", {3: float("nan")}),
        ("logit_bias", {3: 1e6}),
    ],
)
def test_non_finite_or_out_of_range_floats_are_refused(field: str, value: object) -> None:
    # Values that turn a row's logits into inf / NaN in float32 never reach the sampler.
    with pytest.raises(ValueError, match=f"^{field}"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
