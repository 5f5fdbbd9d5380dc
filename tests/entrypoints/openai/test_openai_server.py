"""The OpenAI-compatible server through the official `openai` client."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_utils import API_KEY, MAX_MODEL_LEN, MODEL_NAME

SUBJECTS = ["cats", "the moon", "bread", "rivers", "chess", "rain", "music", "winter",
            "trains", "honey", "volcanoes", "bicycles", "coffee", "owls", "glass", "tea"]  # fmt: skip
PROMPTS = [f"Here is a short fact about {s}:" for s in SUBJECTS] + [
    f"Write one sentence about {s} for a child." for s in SUBJECTS
]
"""32 distinct prompts for the concurrency test."""


@pytest.fixture(scope="session")
def offline_greedy(server_process) -> dict[str, str]:  # noqa: ANN001
    """Greedy 16-token outputs of the offline `LLM` (loaded while the server starts)."""
    from minivllm import LLM, SamplingParams

    llm = LLM(
        num_gpu_blocks_override=512,
        optimization_level=0,
        max_model_len=MAX_MODEL_LEN,
        quantization="none",
    )
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    return {o.prompt: o.outputs[0].text for o in outs}


def test_concurrent_streaming_clients_match_offline(offline_greedy, server, async_client) -> None:  # noqa: ANN001
    async def one(prompt: str) -> tuple[str, str | None, int]:
        stream = await async_client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, reason, usage = "", None, 0
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text += choice.text
                reason = choice.finish_reason or reason
        return text, reason, usage

    async def main() -> list[tuple[str, str | None, int]]:
        return await asyncio.wait_for(asyncio.gather(*(one(p) for p in PROMPTS)), 240)

    results = asyncio.run(main())
    for prompt, (text, reason, _) in zip(PROMPTS, results, strict=True):
        assert text == offline_greedy[prompt], prompt
        assert reason in ("length", "stop")
    assert all(r[2] >= 1 for r in results)


def test_models_health_version(server, client) -> None:  # noqa: ANN001
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json()["version"]


def test_completion_usage_equals_tokenizer_counts(client, tokenizer) -> None:  # noqa: ANN001
    prompt = "The capital of France is"
    resp = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert resp.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert resp.usage.completion_tokens == 7
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 7
    assert resp.model == MODEL_NAME and resp.object == "text_completion"


def test_completion_stream_equals_non_stream(client) -> None:  # noqa: ANN001
    kwargs = dict(model=MODEL_NAME, prompt="My favourite animal is", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})  # fmt: skip
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_n2_logprobs_and_prompt_forms(client, tokenizer) -> None:  # noqa: ANN001
    prompts = ["Roses are red,", "One, two, three,"]
    resp = client.completions.create(
        model=MODEL_NAME, prompt=prompts, n=2, max_tokens=5, temperature=1.0, seed=3, logprobs=2
    )
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert resp.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)
    num_tokens = 0
    for choice in resp.choices:
        lp = choice.logprobs
        num_tokens += len(lp.tokens)
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) >= 1
        assert all(v <= 0 for v in lp.token_logprobs)
        for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
            assert token in top and 2 <= len(top) <= 3  # the sampled token + the top 2
    assert resp.usage.completion_tokens == num_tokens

    # Token ids (one prompt, and a batch of them) give what the text gives.
    ids = tokenizer.encode(prompts[1])
    greedy = dict(model=MODEL_NAME, max_tokens=5, temperature=0)
    by_text = client.completions.create(prompt=prompts[1], **greedy).choices[0].text
    assert client.completions.create(prompt=ids, **greedy).choices[0].text == by_text
    batch = client.completions.create(prompt=[ids, ids[:-1]], **greedy)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == by_text
    assert batch.usage.prompt_tokens == 2 * len(ids) - 1


def test_echo_and_greedy_logprobs(client) -> None:  # noqa: ANN001
    prompt = "The sky is"
    resp = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=1
    )
    choice = resp.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None  # the first prompt token has no logprob
    generated = lp.top_logprobs[-4:]
    for token, top in zip(lp.tokens[-4:], generated, strict=True):
        assert top[token] == max(top.values())  # greedy picks the most likely token


def test_stop_string(client) -> None:  # noqa: ANN001
    kwargs = dict(model=MODEL_NAME, prompt="Hello, my name is", max_tokens=16, temperature=0)
    text = client.completions.create(**kwargs).choices[0].text
    words = text.split()
    assert len(words) >= 4
    stop = " " + words[2]
    cut = client.completions.create(**kwargs, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]
    streamed = client.completions.create(**kwargs, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.text


def test_seed_reproducibility(client) -> None:  # noqa: ANN001
    kwargs = dict(model=MODEL_NAME, prompt="A random word:", max_tokens=10, temperature=1.0,
                  top_p=0.95)  # fmt: skip
    first = client.completions.create(**kwargs, seed=1234).choices[0].text
    second = client.completions.create(**kwargs, seed=1234).choices[0].text
    assert first == second


def test_chat_stream_and_usage(client, tokenizer) -> None:  # noqa: ANN001
    from minivllm.tokenizer import apply_chat_template

    messages = [{"role": "user", "content": "Name a colour."}]
    prompt_ids = apply_chat_template(tokenizer, messages, tokenize=True)
    resp = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=8, temperature=0
    )
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.choices[0].message.role == "assistant"
    assert 1 <= resp.usage.completion_tokens <= 8

    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in with_choices[1:])
    assert with_choices[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == resp.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_chat_n2_logprobs_and_stop(client) -> None:  # noqa: ANN001
    resp = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Count to ten."}], n=2,
        max_tokens=6, temperature=0.8, seed=7, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    assert [c.index for c in resp.choices] == [0, 1]
    total = 0
    for choice in resp.choices:
        content = choice.logprobs.content
        total += len(content)
        assert "".join(t.token for t in content) == choice.message.content
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert resp.usage.completion_tokens == total
    stopped = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Count from 1 to 10."}],
        max_tokens=30, temperature=0, stop=["5"],
    )  # fmt: skip
    assert "5" not in stopped.choices[0].message.content


def test_tokenize_detokenize(server, tokenizer) -> None:  # noqa: ANN001
    text = "Tokenize me, please."
    auth = {"Authorization": f"Bearer {API_KEY}"}  # the key guards these endpoints too
    resp = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, headers=auth).json()
    assert resp["tokens"] == tokenizer.encode(text) and resp["count"] == len(resp["tokens"])
    assert resp["max_model_len"] == MAX_MODEL_LEN
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": resp["tokens"]},
                      headers=auth).json()  # fmt: skip
    assert back["prompt"] == text
    chat = httpx.post(f"{server.url}/tokenize", headers=auth,
                      json={"messages": [{"role": "user", "content": "hi"}]}).json()  # fmt: skip
    assert chat["count"] > 3


def test_metrics_have_vllm_names(server, client) -> None:  # noqa: ANN001
    client.completions.create(model=MODEL_NAME, prompt="Metrics!", max_tokens=2)
    text = httpx.get(f"{server.url}/metrics").text
    for name in [
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total",
    ]:  # fmt: skip
        assert f"{name}{{" in text and f'model_name="{MODEL_NAME}"' in text, name
    assert server.metric("vllm:generation_tokens_total") >= 2
    assert server.metric("vllm:prompt_tokens_total") >= 2
    assert 'finished_reason="length"' in text
    assert API_KEY  # the key is needed for /v1 but not for /metrics
