#!/usr/bin/env bash
# The text twin of the visual warm start: same expert levels (seeds 0..1999), same schedule, the recipe's text
# observation (CoordSokoban grid_coord) and the bundled language model.
set -euo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
bash sft/warm_start.sh sokoban $R/text --train-size=2000 \
    trainer.total_training_steps=${STEPS:-100} trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 \
    trainer.test_freq=50 eval.max_turns=64 > $R/text.log 2>&1
echo done > $R/text.done
