#!/usr/bin/env bash
# Expert multi-turn conversations for SFT, played by the oracle agents in the RL reply format:
#   bash sft/generate_data.sh <env> [--train-size N] [--test-size N] [--seed S] [--output DIR] [overrides...]
# <env> is a recipe in config/ (sokoban, frozen_lake, bandit, countdown); writes data/sft/<env>/{train,test}.parquet.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [ $# -lt 1 ]; then
    echo "usage: bash sft/generate_data.sh <env> [--train-size N] [--test-size N] [--seed S] [--output DIR] [key=value ...]" >&2
    exit 2
fi
ENV_NAME=$1
shift
cd "$(dirname "$0")/.."
python -m ragen.sft.data --env "$ENV_NAME" "$@"
