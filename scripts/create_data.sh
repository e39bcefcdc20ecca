#!/usr/bin/env bash
# Train/test parquet files of start states (first observation + seed) for the default environments:
#   data/<tag>/{train,test}.parquet. Extra arguments go to `python -m ragen.create_data` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ragen.create_data --tags SimpleSokoban FrozenLake Bandit Countdown \
    --train-size 10000 --test-size 100 --seed 10000 --output data "$@"
