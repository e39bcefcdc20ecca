set -u; cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
OBS=(custom_envs.CoordSokoban.env_config.observation_format=grid "custom_envs.CoordSokoban.env_config.cell_separator=''")
bash sft/warm_start.sh sokoban results/obs_grid/warm_seed_2 trainer.seed=2 --train-size=2000 \
  trainer.total_training_steps=400 trainer.train_batch_size=16 trainer.test_freq=200 "${OBS[@]}"
python -m ragen.eval --config-name sokoban model_path=results/obs_grid/warm_seed_2 trainer.val_seed=119000000 \
  es_manager.val.env_groups=128 "${OBS[@]}" hydra.run.dir=results/obs_grid/test119
