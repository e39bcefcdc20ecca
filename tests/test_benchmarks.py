"""The benchmark scripts still run through to their figures. They are run by hand, on the bundled model and at
sizes that take minutes, so a change elsewhere can break one unnoticed (benchmark_step.py stopped at the actor
update for a while, when the actor began to need the engine's log-probs); here each runs at the smallest sizes,
on a tiny random model where it needs one, and must print every figure it promises. Not here: the ones that
train whole recipes (benchmark_cost_growth.py, benchmark_memory.py) or need another environment
(benchmark_vs_trl.py: TRL's; benchmark_llamacpp.py: llama.cpp)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.utils.model import resolve_dtype

REPO = Path(__file__).parents[1]


def run_script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


# float32 runs below (the windowed trajectories), and is what auto becomes on a CPU without fast bf16
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_benchmark_step_prints_every_part_of_a_step(tiny_model_path, dtype):
    out = run_script("benchmark_step.py", "--model", tiny_model_path, "--batch", "2", "--prompt-len", "8",
                     "--new-tokens", "2", "--seq-len", "16", "--generated-tokens", "4", "--train-batch", "2",
                     "--micro-batch", "1", "--dtype", dtype)
    assert "matmul peak: bfloat16" in out and "float32" in out
    assert f", {resolve_dtype(dtype)}, torch threads" in out  # auto: the dtype it became here
    for part in ("generate: batch   2", "old log-probs:", "update (fwd+bwd+step", "critic values:", "critic update"):
        assert part in out, (part, out)


def test_benchmark_step_times_and_profiles_windowed_trajectories(tiny_model_path):
    out = run_script("benchmark_step.py", "--model", tiny_model_path, "--batch", "2", "--prompt-len", "8",
                     "--new-tokens", "2", "--seq-len", "40", "--generated-tokens", "6", "--train-batch", "2",
                     "--micro-batch", "1", "--dtype", "float32", "--turns", "3", "--system-len", "10", "--profile",
                     "--checkpointing", "--no-critic")
    assert "update (fwd+bwd+step, micro-batch 1, checkpointing)" in out and "Self CPU" in out, out
    assert "peak memory of this process so far:" in out and "critic" not in out, out
    assert "aten::" in out  # the profiler's operator table
    with pytest.raises(AssertionError, match="too few"):  # turns too short for their replies: a clear stop
        run_script("benchmark_step.py", "--model", tiny_model_path, "--batch", "1", "--seq-len", "16",
                   "--generated-tokens", "12", "--turns", "3", "--system-len", "10")


def test_benchmark_generate_prints_its_speed(tiny_model_path):
    out = run_script("benchmark_generate.py", "--engine", "torch", "--model", tiny_model_path, "--dtype", "float32",
                     "--batch", "2", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1")
    assert "tokens/s" in out, out


def test_benchmark_rollout_prints_its_table(tiny_model_path):
    out = run_script("benchmark_rollout.py", "--engine", "torch", "--model", tiny_model_path, "--groups", "1",
                     "--group-size", "2", "--turns", "2", "--response-length", "4", "--prefix-cache", "on", "off")
    assert "tokens/s" in out, out


def test_benchmark_envs_prints_steps_and_level_generation():
    out = run_script("benchmark_envs.py", "--seconds", "0.05", "--levels", "3")
    assert "sokoban" in out and "Sokoban level generation over 3 seeds" in out, out


def test_benchmark_env_servers_prints_each_way_of_stepping():
    out = run_script("benchmark_env_servers.py", "--envs", "2", "--latencies-ms", "0", "--turns", "1")
    assert "one by one  concurrent   server" in out and "server:" in out, out
