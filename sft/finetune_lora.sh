#!/usr/bin/env bash
# LoRA fine-tuning on the expert data of sft/generate_data.sh, data parallel over <num_gpus> ranks (torchrun;
# on a machine without GPUs the ranks are CPU processes on gloo):
#   bash sft/finetune_lora.sh <env> <num_gpus> <save_path> [key=value ...]
# e.g. bash sft/finetune_lora.sh sokoban 1 checkpoints/sft/sokoban lora.rank=32 optim.lr=2e-4 trainer.total_epochs=3
# Keys: config/sft.yaml and SFTConfig in ragen/sft/trainer.py. The adapter lands in <save_path>.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [ $# -lt 3 ]; then
    echo "usage: bash sft/finetune_lora.sh <env> <num_gpus> <save_path> [key=value ...]" >&2
    exit 2
fi
ENV_NAME=$1
NPROC=$2
SAVE_PATH=$3
shift 3
cd "$(dirname "$0")/.."
torchrun --standalone --nnodes=1 --nproc_per_node="$NPROC" -m ragen.sft.trainer \
    env="$ENV_NAME" trainer.default_local_dir="$SAVE_PATH" "$@"
