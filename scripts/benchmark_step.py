"""Throughput of the parts of a step on this machine: rollout generation, the actor update, the critic.

    python scripts/benchmark_step.py [--model bundled:SmolLM2-135M-Instruct] [--batch 8 32] [--new-tokens 128]
                                     [--seq-len 600] [--generated-tokens 100] [--dtype auto]
                                     [--turns 10 --system-len 190] [--profile] [--checkpointing] [--no-critic]

First the matmul peaks in bf16 and fp32 (some CPUs run fp32 faster), then the parts of a step in --dtype: `auto`
(the configs' default: bf16 on a GPU or a CPU with AMX or AMD's avx512_bf16, else fp32), bfloat16 or float32, as the keys
actor_rollout_ref.model.dtype, actor_rollout_ref.rollout.dtype and SFT's model.dtype set it in training.
Generation uses the HF rollout engine (--dtype, KV cache, left-padded batch, EOS ignored, so every row
generates exactly --new-tokens). The update runs the actor's forward + backward + AdamW step on
sequences of --seq-len tokens under --dtype autocast with fp32 master weights, as ActorRolloutRefWorker does;
the last --generated-tokens of each are the policy's (loss_mask), the rest prompt and observations (a
FrozenLake trajectory: ~110 generated of ~680). The actor computes logits only at generated tokens.
With --turns K each sequence is instead a trajectory of K equal turns after a --system-len system prompt, each turn
seeing only the system prompt and itself (max_context_window 1, as the Sokoban and FrozenLake recipes train:
the attention mask of ragen/context_manager.py's window_layout), its reply the last --generated-tokens / K tokens.
--profile prints the update's costliest operators (torch.profiler); --checkpointing recomputes the actor's activations
in backward, as `actor_rollout_ref.model.enable_gradient_checkpointing` does (less memory, more compute), and the
process's peak memory is printed after the update; --no-critic stops there.
The critic (the same backbone with a value head) is timed the same way: values, then one update.
"""

import argparse
import time

import torch

from flops import matmul_peak
from ragen.context_manager import window_layout
from verl.protocol import DataProto
from verl.trainer.config import ActorRolloutRefConfig, CriticConfig, ModelConfig, RolloutConfig
from verl.utils import memory
from verl.utils.model import load_tokenizer, resolve_model_path
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.rollout import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bundled:SmolLM2-135M-Instruct")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=600)
    parser.add_argument("--generated-tokens", type=int, default=100)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--turns", type=int, default=0,
                        help="rows as trajectories of this many turns under a one-turn context window (0: plain rows)")
    parser.add_argument("--system-len", type=int, default=190, help="the system prompt's tokens, with --turns")
    parser.add_argument("--profile", action="store_true", help="print the update's costliest operators")
    parser.add_argument("--checkpointing", action="store_true",
                        help="recompute activations in backward (actor_rollout_ref.model.enable_gradient_checkpointing)")
    parser.add_argument("--no-critic", action="store_true", help="time the actor only")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                        help="compute dtype of the actor, the critic and the rollout engine (default: the configs')")
    args = parser.parse_args()

    peaks = {name: matmul_peak(dtype=getattr(torch, name)) / 1e9 for name in ("bfloat16", "float32")}
    print("matmul peak: " + ", ".join(f"{name} {gflops:.0f} GFLOP/s" for name, gflops in peaks.items()))
    path = resolve_model_path(args.model)
    config = ActorRolloutRefConfig(model=ModelConfig(path=path, dtype=args.dtype,
                                                     enable_gradient_checkpointing=args.checkpointing),
                                   rollout=RolloutConfig(dtype=args.dtype))
    config.actor.ppo_mini_batch_size = args.train_batch
    config.actor.ppo_micro_batch_size_per_gpu = args.micro_batch
    worker = ActorRolloutRefWorker(config, rank=0, world_size=1, init_method=None)
    worker.init_model()
    vocab = len(load_tokenizer(path))
    print(f"model {args.model}, {worker.config.model.dtype}, torch threads {torch.get_num_threads()}")

    for batch in args.batch:
        prompts = torch.randint(100, vocab, (batch, args.prompt_len)).tolist()
        sampling = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, seed=0)
        start = time.perf_counter()
        responses = worker.rollout.generate(prompts, sampling).token_ids
        seconds = time.perf_counter() - start
        tokens = sum(len(r) for r in responses)
        print(f"generate: batch {batch:3d} x {args.new_tokens} new tokens (prompt {args.prompt_len}): "
              f"{tokens / seconds:7.1f} tokens/s ({seconds:.1f} s)")

    n, t = args.train_batch, args.seq_len
    layout = training_layout(args)
    loss_mask = layout.pop("loss_mask").repeat(n, 1)
    data = DataProto(batch={
        "input_ids": torch.randint(100, vocab, (n, t)), "attention_mask": torch.ones(n, t, dtype=torch.long),
        "loss_mask": loss_mask, **{key: value.repeat(n, 1) for key, value in layout.items()},
        "advantages": torch.randn(n, 1).expand(n, t).clone(), "token_rewards": torch.zeros(n, t),
        "adv_mask": loss_mask, "returns": torch.randn(n, t)})
    data = data.union(timed_tokens("old log-probs", n * t, lambda: worker.compute_log_prob(data)))
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"].clone()  # as if the engine sampled this policy
    update = f"update (fwd+bwd+step, micro-batch {args.micro_batch}{', checkpointing' if args.checkpointing else ''})"
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            timed_tokens(update, n * t, lambda: worker.update_actor(data))
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    else:
        timed_tokens(update, n * t, lambda: worker.update_actor(data))
    print(f"peak memory of this process so far: {memory.peak_memory_gib(worker.device):.1f} GiB")
    if args.no_critic:
        return

    critic_config = CriticConfig(model=ModelConfig(path=path, dtype=args.dtype), ppo_mini_batch_size=n, ppo_epochs=1,
                                 ppo_micro_batch_size_per_gpu=args.micro_batch,
                                 forward_micro_batch_size_per_gpu=config.rollout.log_prob_micro_batch_size_per_gpu)
    critic = CriticWorker(critic_config, rank=0, world_size=1, init_method=None)
    critic.init_model()
    data = data.union(timed_tokens("critic values", n * t, lambda: critic.compute_values(data)))
    timed_tokens(f"critic update (micro-batch {args.micro_batch})", n * t, lambda: critic.update_critic(data))


def training_layout(args) -> dict[str, torch.Tensor]:
    """One training row's loss_mask and position_ids, and with --turns its hidden_from: (T,) each."""
    t = args.seq_len
    loss_mask = torch.zeros(t)
    if not args.turns:
        loss_mask[-args.generated_tokens:] = 1
        return {"loss_mask": loss_mask, "position_ids": torch.arange(t)}
    turn_len = (t - args.system_len) // args.turns
    if turn_len <= args.generated_tokens // args.turns:
        raise SystemExit(f"--seq-len {t} leaves {turn_len} tokens a turn: too few for the system prompt and replies")
    turn_starts = [args.system_len + j * turn_len for j in range(args.turns)]
    for end in turn_starts[1:] + [t]:
        loss_mask[end - args.generated_tokens // args.turns:end] = 1
    position_ids, hidden_from = window_layout(turn_starts, t, window=1)
    return {"loss_mask": loss_mask, "position_ids": position_ids, "hidden_from": hidden_from}


def timed_tokens(label: str, tokens: int, work):
    """Run `work()`, print its throughput over `tokens` tokens, return its result."""
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    print(f"{label}: {tokens} tokens: {tokens / seconds:7.1f} tokens/s ({seconds:.1f} s)")
    return result

if __name__ == "__main__":
    main()
