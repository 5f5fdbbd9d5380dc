"""Multi-node "mp" runs without Ray, with two processes on loopback standing in for
two nodes: ``--nnodes 2`` and PP=2 put one pipeline stage on each "node"; node 1
is ``minivllm serve --node-rank 1`` (ranks only, no HTTP) and node 0 an `LLM`.
The greedy text is the one-process engine's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minivllm import LLM, SamplingParams

ENGINE = {"dtype": "float32", "optimization_level": 0, "max_model_len": 512,
          "num_gpu_blocks_override": 64}  # fmt: skip
PROMPTS = ["Hello, my name is", "The capital of France is"]
MASTER_PORT = 18560
NODES = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(MASTER_PORT)]


def _greedy(llm: LLM) -> list[str]:
    params = SamplingParams(temperature=0.0, max_tokens=8)
    return [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_pp2_over_two_nodes_on_loopback_matches_one_process() -> None:
    reference = _greedy(LLM(**ENGINE))
    node1 = subprocess.Popen(
        [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", *NODES, "--node-rank", "1",
         "-pp", "2", "--dtype", "float32", "-O0", "--max-model-len", "512",
         "--num-gpu-blocks-override", "64"],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        llm = LLM(pipeline_parallel_size=2, nnodes=2, master_addr="127.0.0.1",
                  master_port=MASTER_PORT, **ENGINE)  # fmt: skip
        try:
            assert _greedy(llm) == reference
        finally:
            llm.llm_engine.shutdown()
        # Node 0's engine stopping ends node 1's ranks, and node 1 with them.
        assert node1.wait(60) == 0, node1.stdout.read() if node1.stdout else ""
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"nnodes": 2, "pipeline_parallel_size": 3}, "must divide"),
        ({"nnodes": 2, "node_rank": 2, "pipeline_parallel_size": 2}, "node_rank one of 0 to 1"),
        ({"nnodes": 2, "tensor_parallel_size": 2, "distributed_executor_backend": "ray"}, "Ray"),
    ],
)
def test_bad_multinode_settings_say_why(kwargs: dict, needle: str) -> None:
    from minivllm.config.parallel import ParallelConfig

    with pytest.raises(ValueError, match=needle):
        ParallelConfig(**kwargs)
