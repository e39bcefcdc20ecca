"""Generation throughput of one rollout engine on a fixed workload, for comparing engines on one machine.

    python scripts/benchmark_generate.py --engine hf                   # in .venv
    .venv-vllm/bin/python scripts/benchmark_generate.py --engine vllm  # in the vLLM environment

Random prompts of --prompt-len tokens, EOS ignored so every row generates exactly --new-tokens, sampled
at temperature 1 with a seed. One untimed warm-up call first (kernels, allocator); then --repeats timed
calls with fresh prompts each, so neither engine's prefix cache can help.
"""

import argparse
import time

import torch

from verl.utils.model import load_tokenizer, resolve_model_path
from verl.workers.rollout import ROLLOUT_ENGINES, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=sorted(ROLLOUT_ENGINES), required=True)
    parser.add_argument("--model", default="bundled:SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    engine = ROLLOUT_ENGINES[args.engine](path, tokenizer, args.dtype, device)
    print(f"{args.engine} engine, {args.model} in {args.dtype} on {device}: built in "
          f"{time.perf_counter() - start:.1f} s, torch threads {torch.get_num_threads()}")

    generator = torch.Generator().manual_seed(0)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, seed=0)
    engine.generate(torch.randint(100, len(tokenizer), (4, 32), generator=generator).tolist(),
                    SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0))  # warm-up
    for _ in range(args.repeats):
        prompts = torch.randint(100, len(tokenizer), (args.batch, args.prompt_len), generator=generator).tolist()
        start = time.perf_counter()
        responses = engine.generate(prompts, sampling).token_ids
        seconds = time.perf_counter() - start
        tokens = sum(len(r) for r in responses)
        print(f"generate: batch {args.batch} x {args.new_tokens} new tokens (prompt {args.prompt_len}): "
              f"{tokens / seconds:7.1f} new tokens/s ({seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
