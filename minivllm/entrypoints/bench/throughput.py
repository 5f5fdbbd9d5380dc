"""``minivllm bench throughput``: offline throughput of the engine on a dataset.

Every request is submitted at once and the engine runs until all have finished;
EOS is ignored so each request generates exactly its output length.  Reported:
requests/s, input, output and total tokens/s (as ``vllm bench throughput``).
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from minivllm.entrypoints.bench.common import add_common_args, print_table, write_json
from minivllm.entrypoints.bench.datasets import SampleRequest, add_dataset_args, get_samples

if TYPE_CHECKING:
    from minivllm.engine.llm_engine import LLMEngine


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Dataset flags, --output-json/--seed/--disable-tqdm and every engine flag."""
    from minivllm.args.engine_args import EngineArgs

    add_dataset_args(parser)
    add_common_args(parser, seed=False)
    EngineArgs.add_cli_args(parser)


def build_engine(args: argparse.Namespace) -> LLMEngine:
    """An `LLMEngine` from the engine flags in ``args``."""
    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))


def run_to_completion(
    engine: LLMEngine,
    prompt_token_ids: list[list[int]],
    output_lens: list[int],
    *,
    tag: str,
    progress: bool,
) -> tuple[float, list[Any]]:
    """Submit every prompt at once, step until all finish; (seconds, outputs in order)."""
    from tqdm.auto import tqdm

    from minivllm.pooling_params import PoolingParams
    from minivllm.sampling_params import RequestOutputKind, SamplingParams

    pooling = engine.vllm_config.model_config.runner_type == "pooling"
    ids = [f"{tag}-{i}" for i in range(len(prompt_token_ids))]
    finished: dict[str, Any] = {}
    bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True, disable=not progress)
    start = time.perf_counter()
    try:
        for request_id, tokens, out_len in zip(ids, prompt_token_ids, output_lens, strict=True):
            if pooling:  # embeddings mode: the prompt is the whole request
                task = (
                    "embed"
                    if engine.vllm_config.model_config.convert_type == "embed"
                    else "classify"
                )
                validated = engine.input_processor.process_pooling(tokens, PoolingParams(), task)
                engine.add_request(request_id, validated)
                continue
            params = SamplingParams(
                temperature=1.0,
                top_p=1.0,
                ignore_eos=True,
                max_tokens=out_len,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            engine.add_request(request_id, {"prompt_token_ids": tokens}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    bar.update(1)
    except BaseException:
        engine.abort_request([r for r in ids if r not in finished])
        raise
    finally:
        bar.close()
    return time.perf_counter() - start, [finished[r] for r in ids]


def summarize(requests: list[SampleRequest], outputs: list[Any], elapsed: float) -> dict[str, Any]:
    """The figures of one run."""
    num_input = sum(r.prompt_len for r in requests)
    # A pooling output (embeddings mode) has no completions.
    num_output = sum(
        len(c.token_ids) for o in outputs if isinstance(o.outputs, list) for c in o.outputs
    )
    return {
        "elapsed_time": elapsed,
        "num_requests": len(requests),
        "total_input_tokens": num_input,
        "total_output_tokens": num_output,
        "total_num_tokens": num_input + num_output,
        "requests_per_second": len(requests) / elapsed,
        "input_tokens_per_second": num_input / elapsed,
        "output_tokens_per_second": num_output / elapsed,
        "tokens_per_second": (num_input + num_output) / elapsed,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark, print the summary, write --output-json; returns the figures."""
    if args.dataset == "sharegpt" and args.dataset_path is None:
        # Checked before the (slow) engine start.
        raise ValueError("--dataset sharegpt needs --dataset-path FILE (a ShareGPT JSON file)")
    engine = build_engine(args)
    requests = get_samples(args, engine.get_tokenizer())
    elapsed, outputs = run_to_completion(
        engine,
        [r.prompt_token_ids for r in requests],
        [r.expected_output_len for r in requests],
        tag="throughput",
        progress=not args.disable_tqdm,
    )
    result = summarize(requests, outputs, elapsed)
    result.update(
        dataset=args.dataset,
        dataset_path=args.dataset_path,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        seed=args.seed or 0,
    )
    print_table(
        "Offline Throughput Result",
        [
            ("Successful requests:", result["num_requests"]),
            ("Elapsed time (s):", result["elapsed_time"]),
            ("Total input tokens:", result["total_input_tokens"]),
            ("Total generated tokens:", result["total_output_tokens"]),
            ("Request throughput (req/s):", result["requests_per_second"]),
            ("Input token throughput (tok/s):", result["input_tokens_per_second"]),
            ("Output token throughput (tok/s):", result["output_tokens_per_second"]),
            ("Total token throughput (tok/s):", result["tokens_per_second"]),
        ],
    )
    print(
        f"Throughput: {result['requests_per_second']:.2f} requests/s, "
        f"{result['tokens_per_second']:.2f} total tokens/s, "
        f"{result['output_tokens_per_second']:.2f} output tokens/s"
    )
    write_json(args.output_json, result)
    return result
