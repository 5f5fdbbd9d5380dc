"""Teacher-forced accuracy through the engine's own paths, against a reference model.

Every figure is about texts of token ids: at each target position ``t`` of a text,
the log-probability a model gives ``text[t]`` after ``text[:t]`` (perplexity) and
the token it ranks first there (top-1 agreement).  Three sources fill a `Scores`:

- `reference_scores`: a plain (HF transformers) model, one forward per text.
- `prefill_scores`: the engine's prefill path, each text one prompt asking
  ``prompt_logprobs=1`` (with a small ``max_num_batched_tokens``, in chunks).
- `decode_scores`: the engine's decode path.  Each text's first ``prompt_len``
  tokens are the prompt; `ForcingSampler` takes the model runner's sampler's
  place, reads each row's raw log-probabilities (vLLM's ``raw_logprobs``: the
  logits as the model gave them) and returns the text's next token instead of a
  sampled one, so every decode step runs on the text itself.  It tells the rows
  apart by their prompt: the requests ask a repetition penalty (which the forcing
  sampler never applies) so that the sampling metadata carries each row's prompt
  and output token ids.

Used by ``benchmarks/accuracy.py`` (the shipped models) and
``tests/compilation/test_teacher_forcing.py`` (the machinery, on a tiny model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from minivllm.sample.logprobs import compute_logprobs
from minivllm.sample.sampler import SamplerOutput


@dataclass
class Scores:
    """Per text and target position ``t`` (1..len-1): the log-probability of
    ``text[t]`` given ``text[:t]`` and the top-1 token there (NaN / -1 where not
    scored; column 0 never is)."""

    logprob: torch.Tensor
    """[num_texts, length] float64."""
    top1: torch.Tensor
    """[num_texts, length] int64."""

    @classmethod
    def empty(cls, num_texts: int, length: int) -> Scores:
        return cls(
            torch.full((num_texts, length), math.nan, dtype=torch.float64),
            torch.full((num_texts, length), -1, dtype=torch.int64),
        )

    @property
    def scored(self) -> torch.Tensor:
        return ~self.logprob.isnan()


@dataclass
class Comparison:
    """One model's scores against the reference's, over the positions both scored."""

    num_positions: int
    top1_agreement: float
    perplexity: float
    reference_perplexity: float

    @property
    def ratio(self) -> float:
        return self.perplexity / self.reference_perplexity


def compare(got: Scores, ref: Scores, where: torch.Tensor | None = None) -> Comparison:
    """Top-1 agreement and perplexities of ``got`` against ``ref`` where both (and
    ``where``, if given) scored."""
    mask = got.scored & ref.scored
    if where is not None:
        mask &= where
    n = int(mask.sum())
    assert n > 0, "no position scored by both"
    agree = (got.top1[mask] == ref.top1[mask]).double().mean().item()
    return Comparison(
        num_positions=n,
        top1_agreement=agree,
        perplexity=math.exp(-got.logprob[mask].mean().item()),
        reference_perplexity=math.exp(-ref.logprob[mask].mean().item()),
    )


@torch.inference_mode()
def reference_scores(model: torch.nn.Module, texts: list[list[int]]) -> Scores:
    """Scores of a causal LM that maps ``input_ids`` to ``.logits`` (one text a call,
    so a large vocabulary's logits are held for one text at a time)."""
    scores = Scores.empty(len(texts), len(texts[0]))
    for i, text in enumerate(texts):
        logits = model(input_ids=torch.tensor([text])).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(text[1:])
        scores.logprob[i, 1:] = logp.gather(-1, targets[:, None]).squeeze(-1)
        scores.top1[i, 1:] = logp.argmax(-1)
    return scores


def hf_model_from_gguf(path: str) -> torch.nn.Module:
    """The float32 model as transformers' own GGUF loader builds it: every tensor
    dequantized by the ``gguf`` package, run by HF's eager code.

    ``from_pretrained(gguf_file=...)`` needs accelerate (not installed); this calls
    the `load_gguf_checkpoint` it would."""
    import numpy as np
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights

    config = AutoConfig.for_model(**load_gguf_checkpoint(path, return_tensors=False)["config"])
    with no_init_weights():  # every weight is overwritten below
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    tied = getattr(config, "tie_word_embeddings", False)
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), missing
    if tied:
        model.tie_weights()
    return model


def prefill_scores(llm: Any, texts: list[list[int]]) -> Scores:
    """Scores from the engine's prompt log-probabilities (the prefill path)."""
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": t} for t in texts], params, use_tqdm=False)
    scores = Scores.empty(len(texts), len(texts[0]))
    for i, (text, out) in enumerate(zip(texts, outs, strict=True)):
        entries = out.prompt_logprobs
        assert entries is not None and entries[0] is None and len(entries) == len(text)
        for t in range(1, len(text)):
            entry = entries[t]
            scores.logprob[i, t] = entry[text[t]].logprob
            scores.top1[i, t] = max(entry.items(), key=lambda kv: kv[1].logprob)[0]
    return scores


class ForcingSampler:
    """Stands in for the model runner's `Sampler`: records each row's raw
    log-probability of the text's next token and its top-1 token, and returns that
    next token as the sampled one (see the module docstring)."""

    def __init__(self, texts: list[list[int]], prompt_len: int) -> None:
        self.texts = texts
        self.prompt_len = prompt_len
        self.text_of = {tuple(t[:prompt_len]): i for i, t in enumerate(texts)}
        assert len(self.text_of) == len(texts), "texts must start with distinct prompts"
        self.scores = Scores.empty(len(texts), len(texts[0]))
        self.num_outputs = torch.full_like(self.scores.top1, -1)
        """Per scored position: how many tokens the request had output before it
        (0: the row of the last prefill chunk, 1 and up: decode steps)."""

    def __call__(self, logits: torch.Tensor, meta: Any) -> SamplerOutput:
        assert meta.prompt_token_ids is not None and meta.output_token_ids is not None
        vocab = logits.shape[-1]
        logp = compute_logprobs(logits)
        top1 = logp.argmax(-1)
        forced = []
        for row in range(logits.shape[0]):
            prompt = meta.prompt_token_ids[row, : self.prompt_len].tolist()
            i = self.text_of[tuple(prompt)]
            done = int((meta.output_token_ids[row] != vocab).sum())
            t = self.prompt_len + done
            token = self.texts[i][t]
            self.scores.logprob[i, t] = logp[row, token].item()
            self.scores.top1[i, t] = int(top1[row])
            self.num_outputs[i, t] = done
            forced.append(token)
        return SamplerOutput(sampled_token_ids=torch.tensor(forced), logprobs=None)


@dataclass
class DecodeRun:
    """What `decode_scores` measured."""

    scores: Scores
    """Every position the decode path scored (the first after the prompt comes
    from the last prefill chunk: `decode_only` leaves it out)."""
    decode_only: torch.Tensor
    """[num_texts, length] bool: positions whose logits came from a decode step."""
    num_decode_steps: int
    """Engine steps that only decoded (as the texts run in lockstep)."""
    num_graph_steps: int
    """Steps the CPU decode graph ran meanwhile (its ``num_steps`` counter)."""


def decode_scores(llm: Any, texts: list[list[int]], prompt_len: int) -> DecodeRun:
    """Scores from teacher-forced decoding of each text after its first
    ``prompt_len`` tokens (all texts one batch; the engine's prefill budget must
    take every prompt in one step for the steps to be counted right)."""
    from minivllm import SamplingParams

    length = len(texts[0])
    assert all(len(t) == length for t in texts)
    runner = llm.llm_engine.executor.worker.model_runner
    graph = runner.forward_runner.decode_graph
    steps_before = graph.num_steps if graph is not None else 0
    forcing = ForcingSampler(texts, prompt_len)
    params = SamplingParams(
        temperature=0.0, max_tokens=length - prompt_len, ignore_eos=True, repetition_penalty=1.5
    )
    saved, runner.sampler = runner.sampler, forcing
    try:
        outs = llm.generate(
            [{"prompt_token_ids": t[:prompt_len]} for t in texts], params, use_tqdm=False
        )
    finally:
        runner.sampler = saved
    for text, out in zip(texts, outs, strict=True):
        assert list(out.outputs[0].token_ids) == text[prompt_len:], "a forced token was lost"
    graph_steps = (graph.num_steps if graph is not None else 0) - steps_before
    return DecodeRun(
        scores=forcing.scores,
        decode_only=forcing.num_outputs >= 1,
        num_decode_steps=length - prompt_len - 1,
        num_graph_steps=graph_steps,
    )


__all__ = [
    "Comparison",
    "DecodeRun",
    "ForcingSampler",
    "Scores",
    "compare",
    "decode_scores",
    "hf_model_from_gguf",
    "prefill_scores",
    "reference_scores",
]
