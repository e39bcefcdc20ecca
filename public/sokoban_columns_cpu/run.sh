# Issue 31, CPU: seed 2's laptop warm start made from scratch with Sokoban's `columns` view (the grid again,
# transposed: vertical neighbours become adjacent tokens), the same 2,000 expert levels and 400 steps of 16, then
# greedy on the 128 levels from 119,000,000 where seed 2's warm start without it solved 87.5 % (with the neighbours
# line 83.6 %). Resumable: run it again after an interruption (the warm start goes on from its last save).
set -u
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
R=results/col_scratch; C=custom_envs.CoordSokoban.env_config.columns=true
bash sft/warm_start.sh sokoban $R/warm_seed_2 --train-size=2000 $C trainer.total_training_steps=400 \
  trainer.train_batch_size=16 trainer.seed=2 >> $R/warm_seed_2.log 2>&1 || exit 1
python -m ragen.eval --config-name sokoban model_path=$R/warm_seed_2 trainer.val_seed=119000000 \
  es_manager.val.env_groups=128 $C hydra.run.dir=$R/col_test119 > $R/col_test119.log 2>&1
echo "columns done $(date)"; grep -A1 '^env ' $R/col_test119.log | tail -1
