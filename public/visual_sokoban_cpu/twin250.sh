#!/usr/bin/env bash
# The text twin of the visual warm start at 250 steps (run250.sh's schedule), then eval250.sh's evaluation on text.
set -euo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
bash sft/warm_start.sh sokoban $R/text250 --train-size=2000 \
    trainer.total_training_steps=250 trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 \
    trainer.test_freq=200 eval.max_turns=64 > $R/text250.log 2>&1
for SEED in 113000000 129000000; do
python -m ragen.eval --config-name sokoban model_path=$R/text250 \
    es_manager.val.env_groups=128 trainer.val_seed=$SEED hydra.run.dir=$R/evaltext250_$SEED \
    > $R/evaltext250_$SEED.log 2>&1
tail -3 $R/evaltext250_$SEED.log
done
echo done > $R/text250.done
