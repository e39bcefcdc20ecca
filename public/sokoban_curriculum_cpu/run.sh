# Issue 31, the curriculum line of the Sokoban ablation: the laptop warm start (seed 2), then the recipe's RL with
# an adaptive curriculum over search_depth 30 -> 100, tested on 128 levels from 113,000,000 (the lever-comparison
# set: compare public/sokoban_rl_cpu seed 2). Resumable: run it again after an interruption.
# 2026-11-29 (second sitting, a CPU without AMX: fp32 matmuls 330 GFLOP/s, bf16 156): steps 101-400 of the warm start in fp32 (steps 1-100 ran bf16 autocast); the RL and the tests keep bf16, named outright (the dtype default became auto = fp32 on such a CPU).
set -u
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
python scripts/reproduce.py sokoban --seeds 2 --warm-start --warm-start-arg=--train-size=2000 \
  --warm-start-arg=trainer.total_training_steps=400 --warm-start-arg=trainer.train_batch_size=16 --warm-start-arg=model.dtype=float32 \
  --val-seed 111000000 --test-seed 113000000 --test-groups 128 --keep-model --out results/sokoban_curriculum \
  es_manager.train.curriculum.type=adaptive 'es_manager.train.curriculum.levels=[30,100]' \
  actor_rollout_ref.model.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16
