"""RAGEN's first data script, `python scripts/dataset_curation.py --output data/sokoban --seed 10000 ...`, as a
call of today's `python -m ragen.create_data` (`bash scripts/create_data.sh` builds every default set).

Same arguments and the same environment variables (DIM_X, DIM_Y, NUM_BOXES, MAX_STEPS, SEARCH_DEPTH set the
Sokoban room). What differs, each said when used: the files are `<output>/SimpleSokoban/{train,test}.parquet`;
a row is a start state (seed, first observation, instructions), with no chat-template prefix (the prompt is
built at run time from the model's own template) and no BFS play (expert conversations for SFT:
`bash sft/generate_data.sh sokoban`).
"""

import argparse
import os
import sys

from ragen import create_data
from ragen.overrides import from_env_vars

ROOM_VARS = ("DIM_X", "DIM_Y", "NUM_BOXES", "MAX_STEPS", "SEARCH_DEPTH")
TAG = "SimpleSokoban"  # the Sokoban of config/base.yaml, the room that the variables above change


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--algo", default="bfs")
    parser.add_argument("--seed", type=int, default=10000)
    parser.add_argument("--output", default="data/sokoban")
    parser.add_argument("--train_size", type=int, default=300)
    parser.add_argument("--test_size", type=int, default=10)
    parser.add_argument("--bfs_max_nodes", type=int)
    parser.add_argument("--prefix", default="qwen-instruct")
    args = parser.parse_args(argv)
    if args.env != "sokoban":
        parser.error(f"--env {args.env}: this script made Sokoban data only; for other environments run "
                     "python -m ragen.create_data --tags <tag> (tags: custom_envs in config/base.yaml)")
    print(f"dataset_curation.py: --prefix {args.prefix}, --algo {args.algo} and --bfs_max_nodes "
          f"{args.bfs_max_nodes} are not used: rows are start states; prompts come from the model's chat template "
          "at run time; expert play for SFT is bash sft/generate_data.sh sokoban", file=sys.stderr)
    overrides = from_env_vars({var: os.environ[var] for var in ROOM_VARS if var in os.environ}, recipe="base")
    create_data.main(["--tags", TAG, "--seed", str(args.seed), "--train-size", str(args.train_size),
                      "--test-size", str(args.test_size), "--output", args.output, "--override", *overrides])
    print(f"written: {args.output}/{TAG}/train.parquet and test.parquet (python -m ragen.create_data)")


if __name__ == "__main__":
    main()
