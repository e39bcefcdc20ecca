#!/bin/bash
# the CPU warm start on 64 fresh levels: greedy, then 4 samples a level at T 1.0 and 1.5
cd /work/main && . .venv/bin/activate && export HF_HUB_OFFLINE=1
M=results/sokoban_cpu/runs/warm_seed_1
python -m ragen.eval --config-name sokoban model_path=$M es_manager.val.env_groups=64 trainer.val_seed=111000000 hydra.run.dir=/tmp/s49/ev_greedy > /tmp/s49/ev_greedy.log 2>&1
for T in 1.0 1.5; do
python -m ragen.eval --config-name sokoban model_path=$M es_manager.val.env_groups=64 es_manager.val.group_size=4 trainer.val_seed=111000000 actor_rollout_ref.rollout.val_kwargs.temperature=$T hydra.run.dir=/tmp/s49/ev_t$T > /tmp/s49/ev_t$T.log 2>&1
done
python /tmp/s49/analyze.py /tmp/s49/ev_greedy/trajectories.jsonl /tmp/s49/ev_t1.0/trajectories.jsonl /tmp/s49/ev_t1.5/trajectories.jsonl > /tmp/s49/diag.txt 2>&1
