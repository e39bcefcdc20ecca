#!/usr/bin/env bash
# The per-move expert warm start in one command: expert data with one move per sample, in the recipe's own reply
# format (sft/generate_data.sh --per-move), then full fine-tuning on it (ragen/sft/trainer.py, lora.rank=0):
#   bash sft/warm_start.sh <env> [output_dir] [--option[=value] ...] [key=value ...]
# <env> is a recipe in config/ with one action per turn (sokoban); output_dir defaults to models/<env>-warm, which
# `bash train.sh <env> model_path=<output_dir>` continues from with RL. Extra key=value arguments go to the SFT
# trainer (config/sft.yaml), e.g. trainer.total_training_steps=200, except overrides of the recipe's environments
# and agent (es_manager.*, agent_proxy.*, custom_envs.*), which go to the data generation, so that the expert plays
# the board as RL will show it (give RL the same ones), and model_path=, which goes to both (the data is tokenized
# for that model; with a vision-language model and an image env, e.g.
# +custom_envs.CoordSokoban.env_config.image_observation=alone, each sample carries its picture); --option=value
# and --flag arguments go to the data generation
# (ragen/sft/data.py), e.g. --noise=0.2 or --train-size=4000; NPROC=N runs N data-parallel ranks. The
# expert data is kept in <output_dir>/data, so warm starts made side by side never share a file; a later call with
# the same data options reuses it, and the same command after an interruption goes on from the last save
# (every trainer.test_freq steps); other data options into an output_dir that holds a model are refused.
# Defaults (measured for Sokoban, greedy, 3 seeds): 16,000 expert episodes (~82,600 moves), 700 steps of 64 samples
# (about half an epoch), lr 1e-4 on a cosine after 10 warm-up steps. Its step-600 saves (one H200, the three seeds
# side by side, ~0.6 s a step with trainer.micro_batch_size_per_gpu=64; step 700 not yet measured) solved 93.0 % +- 0.8
# of 128 levels from 127,000,000 that nothing else used, and 88.5 % +- 3.9 of the 64 from 91,000,000, where the
# earlier default (8,000 episodes, 700 steps of 32; H100) solved 83.9 % +- 2.4 (public/sokoban_warm_start_h200_16k/).
# On 2 CPU cores that is ~8 h; the laptop recipe, 2,000 episodes and 400 steps of 16 (--train-size=2000
# trainer.total_training_steps=400 trainer.train_batch_size=16), gave 75.0 % +- 3.1 on the 91,000,000 levels (H100)
# and takes 55-96 min on 2 CPU cores (seed 1, 2026-11-28: 92.2 % of 64 levels from 111,000,000).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [ $# -lt 1 ]; then
    echo "usage: bash sft/warm_start.sh <env> [output_dir] [--option[=value] ...] [key=value ...]" >&2
    exit 2
fi
ENV_NAME=$1
shift
OUTPUT=models/${ENV_NAME}-warm
if [ $# -gt 0 ] && [[ $1 != *=* && $1 != --* ]]; then
    OUTPUT=$1
    shift
fi
DATA=$OUTPUT/data
DATA_OPTIONS=()
RECIPE=()
TRAINER=()
for arg in "$@"; do
    case $arg in
        --*) DATA_OPTIONS+=("$arg") ;;  # --noise=0.2, --describe-state
        es_manager.*=* | agent_proxy.*=* | custom_envs.*=* | +custom_envs.*=*) RECIPE+=("$arg") ;;
        model_path=*) RECIPE+=("$arg"); TRAINER+=("model.path=${arg#model_path=}") ;;  # the data's tokenizer too
        *) TRAINER+=("$arg") ;;
    esac
done
cd "$(dirname "$0")/.."
DATA_ARGS=(--env "$ENV_NAME" --train-size 16000 --test-size 64 --per-move --output "$DATA" \
    ${DATA_OPTIONS[@]+"${DATA_OPTIONS[@]}"} ${RECIPE[@]+"${RECIPE[@]}"})
data_options() { sed 's/--output [^ ]* //'; }  # the data's options, wherever the folder is named from
if [ "$(data_options 2>/dev/null < "$DATA/command.txt")" == "$(printf '%q ' "${DATA_ARGS[@]}" | data_options)" ]; then
    echo "warm start: reusing the expert data in $DATA"
elif [ -f "$OUTPUT/sft_state.json" ]; then  # its model was trained on the data these options would replace
    echo "warm start: $OUTPUT holds a model trained on expert data made with other options" \
        "($(cat "$DATA/command.txt" 2>/dev/null || echo 'unknown')); choose another output_dir, or remove that one" >&2
    exit 2
else
    rm -f "$DATA/command.txt"
    python -m ragen.sft.data "${DATA_ARGS[@]}"
    printf '%q ' "${DATA_ARGS[@]}" > "$DATA/command.txt"
fi
torchrun --standalone --nnodes=1 --nproc_per_node="${NPROC:-1}" -m ragen.sft.trainer env="$ENV_NAME" \
    trainer.default_local_dir="$OUTPUT" data.train_file="$DATA/train.parquet" data.test_file="$DATA/test.parquet" \
    lora.rank=0 optim.lr=1e-4 optim.lr_warmup_steps=10 trainer.total_training_steps=700 trainer.test_freq=100 \
    trainer.train_batch_size=64 trainer.micro_batch_size_per_gpu=8 eval.max_new_tokens=16 ${TRAINER[@]+"${TRAINER[@]}"}
echo "warm start: $OUTPUT (continue with: bash train.sh $ENV_NAME model_path=$OUTPUT)"
