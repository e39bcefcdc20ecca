# Observation ablation, separated grid (cells one token each, no coordinate header): seed 2's laptop warm start,
# as public/sokoban_obs_grid_cpu/run.sh but with only observation_format=grid; then greedy on the same level sets.
set -u; cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
OBS=(custom_envs.CoordSokoban.env_config.observation_format=grid)
M=results/obs_sepgrid/warm_seed_2
bash sft/warm_start.sh sokoban $M trainer.seed=2 --train-size=2000 \
  trainer.total_training_steps=400 trainer.train_batch_size=16 trainer.test_freq=200 "${OBS[@]}"
for SEED in 119000000 113000000 123000000 125000000; do
  python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=$SEED es_manager.val.env_groups=128 \
    "${OBS[@]}" hydra.run.dir=results/obs_sepgrid/test${SEED:0:3}
done
