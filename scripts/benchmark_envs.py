"""Environment speed: steps per second of every registered env, and Sokoban level generation time.

    python scripts/benchmark_envs.py [--seconds 3] [--levels 200]

Steps are random well-formed actions (`env.sample_action`), resets included whenever an episode ends, so
the figure is what a rollout worker pays per action. Level generation is timed per `reset()` of a fresh
seed, for the room sizes the recipes use (6x6/1, 8x8/2, 10x10/2).
"""

import argparse
import time

import numpy as np

from ragen.envs import ENV_REGISTRY, make_env

SOKOBAN_ROOMS = [(6, 1), (8, 2), (10, 2)]  # (side, boxes) of square rooms


def steps_per_second(env_type: str, seconds: float) -> float:
    env, rng = make_env(env_type), np.random.default_rng(0)
    env.reset(seed=0)
    steps, episodes, start = 0, 1, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.sample_action(rng))
        steps += 1
        if terminated or truncated:
            env.reset(seed=episodes)
            episodes += 1
    return steps / (time.perf_counter() - start)


def generation_times_ms(dim: int, num_boxes: int, levels: int) -> np.ndarray:
    env = make_env("sokoban", {"dim_x": dim, "dim_y": dim, "num_boxes": num_boxes})
    times = []
    for seed in range(levels):
        start = time.perf_counter()
        env.reset(seed=seed)
        times.append((time.perf_counter() - start) * 1000)
    return np.array(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="time spent stepping each env")
    parser.add_argument("--levels", type=int, default=200, help="Sokoban levels generated per room size")
    args = parser.parse_args()

    print(f"{'env':<14}{'steps/s':>12}")
    for env_type in sorted(ENV_REGISTRY):
        print(f"{env_type:<14}{steps_per_second(env_type, args.seconds):>12,.0f}")

    print(f"\nSokoban level generation over {args.levels} seeds (ms per level)")
    print(f"{'room':<12}{'mean':>8}{'p50':>8}{'p99':>8}{'max':>8}")
    for dim, num_boxes in SOKOBAN_ROOMS:
        t = generation_times_ms(dim, num_boxes, args.levels)
        print(f"{f'{dim}x{dim}/{num_boxes}':<12}{t.mean():>8.2f}{np.median(t):>8.2f}"
              f"{np.percentile(t, 99):>8.2f}{t.max():>8.2f}")


if __name__ == "__main__":
    main()
