# After run.sh: the plain-grid warm start greedy on more level sets, and on formats it was not trained on.
set -u; cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
M=results/obs_grid/warm_seed_2
G=custom_envs.CoordSokoban.env_config
for SEED in 113000000 123000000 125000000; do
    python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=$SEED es_manager.val.env_groups=128 \
        $G.observation_format=grid "$G.cell_separator=''" hydra.run.dir=results/obs_grid/test${SEED:0:3}
done
python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=119000000 es_manager.val.env_groups=128 \
    hydra.run.dir=results/obs_grid/test119_as_grid_coord
python -m ragen.eval --config-name sokoban model_path=$M trainer.val_seed=119000000 es_manager.val.env_groups=128 \
    $G.observation_format=grid hydra.run.dir=results/obs_grid/test119_as_sepgrid
