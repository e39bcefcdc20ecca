# Issue 31, CPU: the laptop warm start of seed 2 made again from scratch with the neighbours line (the same 2,000
# expert levels, 400 steps of 16, seed 2), then both it and the warm start without the line
# (results/sokoban_cpu/runs/warm_seed_2) greedy on 128 levels from 119,000,000, which no run or choice had used.
# Resumable: run it again after an interruption (the warm start goes on from its last save, every 100 steps).
set -u
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
R=results/nb_scratch; N=custom_envs.CoordSokoban.env_config.neighbours=true
[ -f $R/plain_test119/trajectories.jsonl ] || python -m ragen.eval --config-name sokoban \
  model_path=results/sokoban_cpu/runs/warm_seed_2 trainer.val_seed=119000000 es_manager.val.env_groups=128 \
  hydra.run.dir=$R/plain_test119 > $R/plain_test119.log 2>&1
echo "plain done $(date)"; grep -A1 '^env ' $R/plain_test119.log | tail -1
bash sft/warm_start.sh sokoban $R/warm_seed_2 --train-size=2000 $N trainer.total_training_steps=400 \
  trainer.train_batch_size=16 trainer.seed=2 >> $R/warm_seed_2.log 2>&1 || exit 1
python -m ragen.eval --config-name sokoban model_path=$R/warm_seed_2 trainer.val_seed=119000000 \
  es_manager.val.env_groups=128 $N hydra.run.dir=$R/nb_test119 > $R/nb_test119.log 2>&1
echo "neighbours done $(date)"; grep -A1 '^env ' $R/nb_test119.log | tail -1
