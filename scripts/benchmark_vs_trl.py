"""RAGEN against Hugging Face TRL's GRPOTrainer on the same machine, one run after the other:

    bash scripts/install_trl_bench.sh          # once: .venv-trl, RAGEN as the README installs it, plus TRL
    HF_HUB_OFFLINE=1 .venv-trl/bin/python scripts/benchmark_vs_trl.py [--steps 8] [--trl-dtype ...] [key=value ...]

The matched configuration: the bundled SmolLM2-135M-Instruct; the Bandit task's prompt (RAGEN's own,
rendered by its context manager, given to TRL as text); one group of 8 replies; temperature 0.7; at most 64
new tokens, ending at EOS or `</answer>` (RAGEN's rollout stops there; TRL's `generate` gets it as a stop
string); AdamW at lr 1e-6; no KL; GRPO advantages; one optimizer step per batch, so neither framework
scores old log-probs; `--steps` steps. RAGEN keeps fp32 master weights and computes in bf16. TRL runs
twice: with fp32 weights and `bf16=True` (the same precision: bf16 autocast in its update, while its
generation runs in fp32) and with bf16 weights (everything in bf16, no fp32 master copy; its fastest).
Hydra overrides after the options go to RAGEN (`actor_rollout_ref.rollout.name=hf`).

Each run is a process of its own (this script with `--run trl|ragen`), which prints one JSON line per step:
its wall time and stages, generated tokens, and the tokens and matmul FLOPs of its update; and at the end
the peak RSS of the one process that trains (TRL's, or RAGEN's `trainer.backend=local` process), from the
kernel's own count (getrusage), so that nothing samples the processes while they are timed (reading a
process's PSS every 0.2 s walks its page tables and slowed the steps by 15 % (TRL) to 29 % (RAGEN)). Printed per run:
the median over steps 2..N (step 1 warms up) of the step and its stages, the generated tokens, the
update's FLOP/s against the bf16 matmul peak measured here first, and the peak RSS; then RAGEN's times
over TRL's.
"""

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flops import matmul_peak, update_flops

MODEL = "bundled:SmolLM2-135M-Instruct"
GROUP, NEW_TOKENS, TEMPERATURE, LR = 8, 64, 0.7, 1e-6
RAGEN_OVERRIDES = [
    "trainer.backend=local", "algorithm.adv_estimator=grpo", "algorithm.skip_zero_variance_batches=false",
    "es_manager.train.env_groups=1", f"es_manager.train.group_size={GROUP}",
    "es_manager.train.env_configs.tags=[Bandit]", "actor_rollout_ref.rollout.rollout_filter_value=1",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUP}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={GROUP}",
    "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.entropy_coeff=0",
    f"actor_rollout_ref.actor.optim.lr={LR}", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    f"actor_rollout_ref.rollout.temperature={TEMPERATURE}", f"actor_rollout_ref.rollout.response_length={NEW_TOKENS}",
    "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
    "logging.log_images=false"]


def bandit_prompt() -> str:
    """The first prompt of a RAGEN Bandit episode, as text (chat template applied, `<think>` opened)."""
    from ragen.overrides import load_config
    from ragen.context_manager import ContextManager
    from ragen.env_state_manager import EnvStateManager
    from verl.utils.model import eos_token_ids, load_tokenizer, resolve_model_path

    cfg = load_config("bandit", RAGEN_OVERRIDES)
    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    envs = EnvStateManager(cfg.es_manager.train, cfg.custom_envs, cfg.trainer.seed)
    context = ContextManager.for_envs(tokenizer, cfg.agent_proxy, envs.env_per_tag(), eos_token_ids(path, tokenizer))
    state = envs.reset(0)[0]
    return tokenizer.decode(context.start(state.tag, state.obs, state.actions_left).input_ids)


def run_trl(steps: int, dtype: str) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragen.context_manager import parse_reply
    from ragen.envs.bandit import BanditConfig, BanditEnv
    from verl.utils.model import load_tokenizer, resolve_model_path

    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    env = BanditEnv(BanditConfig(safe_arm_name="phoenix", risky_arm_name="dragon"))

    def bandit_reward(completions: list[str], **_) -> list[float]:
        rewards = []
        for i, completion in enumerate(completions):
            answer_end = completion.find("</answer>")  # TRL does not stop there; RAGEN's reply would have
            reply = completion[:answer_end + len("</answer>")] if answer_end >= 0 else completion
            reply = parse_reply("<think>" + reply, enable_think=True, action_sep="||", max_actions=1)
            env.reset(seed=i)
            rewards.append(env.step(reply.actions[0])[1] if reply.actions else -0.1)
        return rewards

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl_"), per_device_train_batch_size=GROUP,
                      num_generations=GROUP, max_completion_length=NEW_TOKENS, temperature=TEMPERATURE,
                      learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, beta=0.0, bf16=True,
                      use_cpu=True, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
                      num_iterations=1, gradient_accumulation_steps=1, seed=0, dataloader_num_workers=0,
                      generation_kwargs={"stop_strings": ["</answer>"]})
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    # TRL generates until EOS; RAGEN's rollout also stops at `</answer>`. Stop TRL there too, so that both
    # generate the same kind of reply (TRL's generate() is transformers', which takes stop strings)
    # (the strings go in its generation config; the tokenizer that matches them goes to generate())
    model.generate = functools.partial(model.generate, tokenizer=tokenizer)
    prompt = bandit_prompt()
    trainer = GRPOTrainer(model=model, reward_funcs=bandit_reward, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": [prompt] * (GROUP * steps)}))
    stages: dict[str, float] = {}
    generated: list[list[int]] = []

    def timed(name: str, method):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            result = method(*a, **kw)
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - start
            return result
        return wrapper

    generate = trainer._generate

    def generate_and_count(prompts):
        result = generate(prompts)
        generated.append([len(ids) for ids in result[1]])  # (prompt_ids, completion_ids, ...)
        return result

    trainer._generate = timed("generate", generate_and_count)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False).input_ids)

    class PerStep(TrainerCallback):
        def on_step_begin(self, *_, **__):
            stages.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - self.start
            lengths = generated[-1]
            emit(step=step, generate=stages["generate"],
                 rewards_and_advantages=stages["generate_and_score"] - stages["generate"],
                 update=step - stages["generate_and_score"], generated_tokens=sum(lengths),
                 update_tokens=sum(prompt_tokens + n for n in lengths),
                 update_flops=update_flops(model.config, [prompt_tokens + n for n in lengths], sum(lengths)))

    trainer.add_callback(PerStep())
    trainer.train()
    print(f"PEAK_RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}", flush=True)


def run_ragen(steps: int, overrides: list[str]) -> None:
    from transformers import AutoConfig

    from verl.utils.model import resolve_model_path

    run_dir = Path(tempfile.mkdtemp(prefix="ragen_"))
    command = [sys.executable, "-m", "ragen.train", "--config-name", "bandit", *RAGEN_OVERRIDES,
               f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={run_dir}",
               f"hydra.run.dir={run_dir}/hydra", *overrides]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"PEAK_RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}", flush=True)
    config = AutoConfig.from_pretrained(resolve_model_path(MODEL))
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        m = json.loads(line)
        rows, update_tokens = GROUP, m["perf/update_tokens"]  # every trajectory is one row; prompts + replies
        flops = update_flops(config, [update_tokens / rows] * rows, m["perf/generated_tokens"])
        emit(step=m["timing_s/step"], generate=m["timing_s/gen"], old_log_probs=m.get("timing_s/old_log_prob", 0.0),
             rewards_and_advantages=m["timing_s/adv"], update=m["timing_s/update_actor"],
             generated_tokens=m["perf/generated_tokens"], update_tokens=update_tokens, update_flops=flops)


def emit(**row) -> None:
    print("STEP " + json.dumps(row), flush=True)


def measure(framework: str, steps: int, trl_dtype: str, overrides: list[str]) -> tuple[list[dict], int]:
    """Run one framework in its own process; its per-step rows and the peak RSS of its training process."""
    command = [sys.executable, __file__, "--run", framework, "--steps", str(steps), "--trl-dtype", trl_dtype,
               *overrides]
    child = subprocess.run(command, stdout=subprocess.PIPE, encoding="utf-8")
    if child.returncode != 0:
        sys.exit(f"{framework} run failed (exit {child.returncode})")
    lines = child.stdout.splitlines()
    rows = [json.loads(line[5:]) for line in lines if line.startswith("STEP ")]
    return rows, int(next(line.split()[1] for line in lines if line.startswith("PEAK_RSS ")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--run", choices=["trl", "ragen"], help="(internal) run one framework and print its steps")
    parser.add_argument("--only", choices=["trl", "ragen"], help="measure one framework only")
    parser.add_argument("--trl-dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"],
                        help="TRL's weights, one run each: float32 (as RAGEN: fp32 master weights, bf16 autocast "
                             "in the update; TRL then generates in fp32) or bfloat16 (all bf16, no fp32 master)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for RAGEN")
    args = parser.parse_intermixed_args()
    if args.run == "trl":
        return run_trl(args.steps, args.trl_dtype[0])
    if args.run == "ragen":
        return run_ragen(args.steps, args.overrides)

    peak = matmul_peak()
    print(f"bf16 matmul peak: {peak / 1e9:.0f} GFLOP/s ({torch.get_num_threads()} threads)", flush=True)
    stages = ["step", "generate", "old_log_probs", "rewards_and_advantages", "update"]
    print(f"median of steps 2..{args.steps} (s) | " + " | ".join(stages) +
          " | generated tokens | update tokens | update GFLOP/s (% of peak) | peak RSS GiB")
    results = {}
    runs = [("trl", dtype) for dtype in args.trl_dtype] + [("ragen", "")]
    for framework, dtype in [run for run in runs if args.only in (None, run[0])]:
        name = f"TRL, {dtype} weights" if framework == "trl" else "RAGEN"
        rows, rss = measure(framework, args.steps, dtype or "float32", args.overrides)
        later = rows[1:] or rows
        median = {k: statistics.median(r.get(k, 0.0) for r in later) for k in [*stages, "generated_tokens",
                                                                               "update_tokens"]}
        speed = statistics.median(r["update_flops"] / r["update"] for r in later)
        results[name] = median
        print(f"{name} | " + " | ".join(f"{median[k]:.2f}" for k in stages) +
              f" | {median['generated_tokens']:.0f} | {median['update_tokens']:.0f} | "
              f"{speed / 1e9:.0f} ({100 * speed / peak:.0f} %) | {rss / 2**30:.2f}", flush=True)
        for i, r in enumerate(rows, 1):
            print(f"    step {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k != "update_flops"))
    ragen = results.get("RAGEN")
    for name, trl in results.items():
        if ragen is not None and name != "RAGEN":
            print(f"RAGEN / {name}: step {ragen['step'] / trl['step']:.2f}, generate {ragen['generate'] / trl['generate']:.2f},"
                  f" update {ragen['update'] / trl['update']:.2f}; generated tokens per step "
                  f"{ragen['generated_tokens']:.0f} vs {trl['generated_tokens']:.0f}")


if __name__ == "__main__":
    main()
