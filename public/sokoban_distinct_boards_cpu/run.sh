#!/usr/bin/env bash
# Sokoban laptop warm start on expert data without repeated boards (--distinct-boards), seed 1, then greedy test
# on the 128 reserved levels from 115,000,000 (sokoban_final_cpu's seed 1 warm start: 79.7 %).
set -euo pipefail
cd "$(dirname "$0")/../.."; . .venv/bin/activate; export HF_HUB_OFFLINE=1
OUT=results/sokoban_distinct
W=$OUT/warm_seed_1
mkdir -p $OUT
if [ ! -f $W/done ]; then
  bash sft/warm_start.sh sokoban $W trainer.seed=1 --train-size=2000 --distinct-boards \
    trainer.total_training_steps=400 trainer.train_batch_size=16 > $OUT/warm_seed_1.log 2>&1
  touch $W/done
fi
T=$OUT/test_115000000x128
if [ ! -f $T/metrics.json ]; then
  python -m ragen.eval --config-name sokoban model_path=$W trainer.val_seed=115000000 es_manager.val.env_groups=128 \
    hydra.run.dir=$T > $OUT/test_115.log 2>&1
fi
echo QUEUE_DONE
