"""The engine's one validation point (`InputProcessor.process`): one prompt-length rule,
the scheduler's limits on the same call, one grammar compile per request."""

from __future__ import annotations

import pytest
from input_helpers import make_input_processor

from minivllm.engine.input_processor import ValidatedRequest
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams


def test_a_prompt_must_leave_room_for_one_generated_token() -> None:
    proc = make_input_processor(max_model_len=32)
    for max_tokens in (None, 1):
        ok = proc.process([5] * 31, SamplingParams(max_tokens=max_tokens))
        assert isinstance(ok, ValidatedRequest) and len(ok.prompt_token_ids) == 31
    for length in (32, 33):
        with pytest.raises(ValueError, match="maximum context length is 32") as info:
            proc.process([5] * length, SamplingParams(max_tokens=None))
        assert f"the prompt has {length} tokens" in str(info.value)
    with pytest.raises(ValueError, match=r"asks for 33 \(31 in the prompt \+ 2 max_tokens\)"):
        proc.process([5] * 31, SamplingParams(max_tokens=2))


def test_scheduler_limits_are_checked_by_the_same_call() -> None:
    proc = make_input_processor(max_model_len=256, num_blocks=5)  # 4 blocks: 16 tokens
    with pytest.raises(ValueError, match="does not fit in the whole KV cache"):
        proc.process([5] * 17)
    with pytest.raises(ValueError, match="n=2 completions"):
        proc.process([5] * 9, SamplingParams(n=2))
    with pytest.raises(ValueError, match="policy 'priority'"):
        proc.process([5] * 4, priority=1)
    unchunked = make_input_processor(
        max_model_len=256, max_num_batched_tokens=8, enable_chunked_prefill=False
    )
    with pytest.raises(ValueError, match="enable chunked prefill"):
        unchunked.process([5] * 9)
    with pytest.raises(ValueError, match="out of vocabulary"):
        proc.process([100])
    with pytest.raises(ValueError, match="empty"):
        proc.process([])


def test_the_validated_request_owns_its_params_with_the_models_eos() -> None:
    proc = make_input_processor(model_eos=[7, 8])
    params = SamplingParams(max_tokens=3)
    checked = proc.process("hello", params)
    assert checked.prompt == "hello" and len(checked.prompt_token_ids) == 5
    assert checked.params is not params and checked.params.all_stop_token_ids >= {2, 7, 8}
    assert params.all_stop_token_ids == set()  # the caller's copy is untouched


class CountingGrammars:
    def __init__(self) -> None:
        self.calls = 0

    def grammar_for(self, spec: StructuredOutputsParams) -> object:
        self.calls += 1
        return ("compiled", spec.regex)


def test_a_grammar_is_compiled_once_per_request() -> None:
    proc = make_input_processor()
    grammars = CountingGrammars()
    proc._structured_outputs = grammars  # type: ignore[assignment]
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    checked = proc.process([5, 6], params)
    assert grammars.calls == 1 and checked.grammar == ("compiled", "[0-9]+")
    assert proc.process([5, 6]).grammar is None and grammars.calls == 1
