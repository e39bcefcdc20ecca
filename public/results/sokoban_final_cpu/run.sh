# Issue 31, the final re-run of `bash train.sh sokoban` on 2 CPU cores: the laptop warm start, then the recipe's RL,
# 3 training seeds, tested greedily on 128 levels from 115,000,000 (reserved: no run and no choice used them).
# Resumable: run it again after an interruption (warm starts save every 100 steps, RL every step).
# Usage: bash results/sokoban_final/run.sh 2   (one seed a sitting; then --table over all).
set -u
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
python scripts/reproduce.py sokoban --seeds "$@" --warm-start --warm-start-arg=--train-size=2000 \
  --warm-start-arg=trainer.total_training_steps=400 --warm-start-arg=trainer.train_batch_size=16 \
  --val-seed 111000000 --test-seed 115000000 --test-groups 128 --keep-model --out results/sokoban_final
