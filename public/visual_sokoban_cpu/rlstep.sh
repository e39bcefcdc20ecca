#!/usr/bin/env bash
# One RL step of the sokoban recipe (4 x 4, RLOO, 10 one-move turns, window 1) from each warm start: pictures vs text.
set -euo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
COMMON="trainer.total_training_steps=1 trainer.val_before_train=false trainer.test_freq=-1 trainer.logger=[console,jsonl]"
bash train.sh sokoban model_path=$R/warm +custom_envs.CoordSokoban.env_config.image_observation=alone \
    trainer.default_local_dir=$R/rl_pictures $COMMON > $R/rl_pictures.log 2>&1
bash train.sh sokoban model_path=$R/text trainer.default_local_dir=$R/rl_text $COMMON > $R/rl_text.log 2>&1
echo done > $R/rl.done
