#!/usr/bin/env bash
# World-model warm start (SPA): the model plays the recipe's training envs in the world-model reply format, its
# replies get the true states, it is fine-tuned on them (torchrun over <num_gpus> ranks; CPU processes on gloo
# without GPUs), and the held-out state accuracy before and after is printed and saved to <output_dir>/score.json:
#   bash sft/world_model.sh <env> <num_gpus> <output_dir> [--option ...] [key=value ...]
# e.g. bash sft/world_model.sh sokoban 1 checkpoints/sft/sokoban-wm es_manager.train.env_configs.tags=[CoordSokoban]
# SPA's defaults: 1,280 self-play episodes, <= 6,400 training turns, full fine-tuning, lr 1e-4, batch 16, 5 epochs.
# Options (--train-episodes, --temperature, --lora-rank, --sft key=value, ...): python -m ragen.sft.world_model stage -h
# The fine-tuned model (<output_dir>/model, or model_merged with --lora-rank N) is a model_path for train.sh.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [ $# -lt 3 ]; then
    echo "usage: bash sft/world_model.sh <env> <num_gpus> <output_dir> [--option ...] [key=value ...]" >&2
    exit 2
fi
ENV_NAME=$1
NPROC=$2
OUTPUT=$3
shift 3
cd "$(dirname "$0")/.."
python -m ragen.sft.world_model stage --env "$ENV_NAME" --nproc "$NPROC" --output "$OUTPUT" "$@"
