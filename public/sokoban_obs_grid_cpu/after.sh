set -u; cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
while pgrep -f "results/obs_grid/run.sh" > /dev/null; do sleep 20; done
M=results/obs_grid/warm_seed_2
G=custom_envs.CoordSokoban.env_config
python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=113000000 es_manager.val.env_groups=128 \
  $G.observation_format=grid "$G.cell_separator=''" hydra.run.dir=results/obs_grid/test113
# formats it was not trained on, on the 119M levels
python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=119000000 es_manager.val.env_groups=128 \
  hydra.run.dir=results/obs_grid/test119_as_grid_coord
python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=119000000 es_manager.val.env_groups=128 \
  $G.observation_format=grid hydra.run.dir=results/obs_grid/test119_as_sepgrid
