#!/usr/bin/env bash
# Visual Sokoban agent on 2 CPU cores: cell-aligned VLM (stage 1), per-move warm start on pictures alone, greedy eval.
set -euo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
[ -f $R/vlm/model/score.json ] || bash sft/vision_align.sh sokoban $R/vlm --cell-steps 100 --steps 0 > $R/align.log 2>&1
bash sft/warm_start.sh sokoban $R/warm model_path=$R/vlm/model \
    +custom_envs.CoordSokoban.env_config.image_observation=alone --train-size=2000 \
    trainer.total_training_steps=${STEPS:-100} trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 \
    trainer.test_freq=50 eval.max_turns=64 > $R/warm.log 2>&1
echo done > $R/warm.done
