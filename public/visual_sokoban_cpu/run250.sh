#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
[ -f $R/vlm/model/score.json ] || bash sft/vision_align.sh sokoban $R/vlm --cell-steps 100 --steps 0 > $R/align.log 2>&1
bash sft/warm_start.sh sokoban $R/warm250 model_path=$R/vlm/model \
    +custom_envs.CoordSokoban.env_config.image_observation=alone --train-size=2000 \
    trainer.total_training_steps=250 trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 \
    trainer.test_freq=200 eval.max_turns=64 > $R/warm250.log 2>&1
echo done > $R/warm250.done
