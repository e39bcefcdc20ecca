#!/usr/bin/env bash
# Issue 31: FrozenLake's CPU recipe with one lever changed, es_manager.train.shared_randomness=true (common random
# numbers in a group), RL from seed 1's warm start (copied from results/frozen_lake_cpu). Resumable: run again.
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
date
python scripts/reproduce.py frozen_lake --seeds 1 --warm-start --warm-start-arg=--train-size=2000 \
  --warm-start-arg=trainer.total_training_steps=400 --warm-start-arg=trainer.train_batch_size=16 \
  --val-seed 135000000 --test-seed 137000000 --test-groups 128 --out results/frozen_lake_crn \
  es_manager.train.shared_randomness=true
date
