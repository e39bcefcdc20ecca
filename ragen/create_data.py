"""Write train/test parquet files of environment start states: `bash scripts/create_data.sh`.

One row per seed: the env's first observation together with everything needed to reproduce it (tag,
env type, env config, seed) and the task instructions the agent sees. Train and test seeds never
overlap: train uses `seed .. seed+train_size-1`, test the `test_size` seeds after those. The files are for
inspecting what a run trains on, for fixed evaluation sets and for SFT data; training itself draws its
seeds from `trainer.seed` (the env-state manager) and needs no files.

    python -m ragen.create_data --tags SimpleSokoban FrozenLake --train-size 10000 --test-size 100
"""

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragen.config import CustomEnvConfig
from ragen.overrides import load_config
from ragen.envs import make_env


def start_states(tag: str, spec: CustomEnvConfig, seeds: Sequence[int], split: str) -> pa.Table:
    env = make_env(spec.env_type, dict(spec.env_config))
    rows = {"tag": [], "env_type": [], "env_config": [], "split": [], "seed": [], "observation": [],
            "instructions": []}
    env_config = json.dumps(dict(spec.env_config), sort_keys=True)
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        rows["tag"].append(tag)
        rows["env_type"].append(spec.env_type)
        rows["env_config"].append(env_config)
        rows["split"].append(split)
        rows["seed"].append(seed)
        rows["observation"].append(observation)
        rows["instructions"].append(env.instructions)  # per instance: a config may change it (arm names, symbols)
    return pa.table(rows)


def write_parquet(table: pa.Table, path: Path) -> None:
    """Written whole: a staging file renamed into place, so a killed run never leaves a file that looks complete.
    The staging file is the writer's own (its pid), so runs writing the same file at once (several seeds' warm
    starts) each rename a complete one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".parquet.{os.getpid()}.tmp")
    pq.write_table(table, staging)
    staging.replace(path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tags", nargs="+", required=True, help="custom_envs tags from config/base.yaml")
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--test-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=10_000, help="first train seed")
    parser.add_argument("--output", type=Path, default=Path("data"), help="writes <output>/<tag>/{train,test}.parquet")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides for config/base.yaml")
    args = parser.parse_args(argv)
    if args.train_size < 0 or args.test_size < 0:
        parser.error("--train-size and --test-size must be >= 0")

    custom_envs = load_config("base", args.override, announce=True).custom_envs
    unknown = [tag for tag in args.tags if tag not in custom_envs]
    if unknown:
        parser.error(f"unknown tags {unknown}; custom_envs in config/base.yaml are {sorted(custom_envs)}")

    test_start = args.seed + args.train_size
    for tag in args.tags:
        start = time.perf_counter()
        (args.output / tag).mkdir(parents=True, exist_ok=True)
        for split, seeds in (("train", range(args.seed, test_start)),
                             ("test", range(test_start, test_start + args.test_size))):
            write_parquet(start_states(tag, custom_envs[tag], seeds, split), args.output / tag / f"{split}.parquet")
        print(f"{tag}: {args.train_size} train + {args.test_size} test rows in {args.output / tag} "
              f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
