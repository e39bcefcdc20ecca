#!/usr/bin/env bash
# Greedy evaluation of the visual warm start (250 steps) on 128 levels from 113,000,000 and 128 from 129,000,000
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
M=results/visual/warm250
for SEED in 113000000 129000000; do
python -m ragen.eval --config-name sokoban model_path=$M +custom_envs.CoordSokoban.env_config.image_observation=alone \
    es_manager.val.env_groups=128 trainer.val_seed=$SEED hydra.run.dir=results/visual/eval250_$SEED \
    > results/visual/eval250_$SEED.log 2>&1
tail -3 results/visual/eval250_$SEED.log
done
