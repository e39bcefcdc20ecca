# Issue 31, CPU: does a line naming the four cells around the player (custom_envs.CoordSokoban.env_config.neighbours)
# mend seed 2's confident moves into walls? The DAgger lab's continuation setting: from
# results/sokoban_cpu/runs/warm_seed_2, 200 steps of 16 at lr 5e-5, seed 2, on per-move expert rows (no noise).
set -u
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
R=results/neighbours; N=custom_envs.CoordSokoban.env_config.neighbours=true; name=nb
[ -f $R/${name}_data/train.parquet ] || python -m ragen.sft.data --env sokoban --train-size 4000 --test-size 64 \
  --per-move --output $R/${name}_data $N > $R/${name}_data.log 2>&1
torchrun --standalone --nnodes=1 --nproc_per_node=1 -m ragen.sft.trainer env=sokoban \
  model.path=results/sokoban_cpu/runs/warm_seed_2 trainer.default_local_dir=$R/$name \
  data.train_file=$R/${name}_data/train.parquet data.test_file=$R/${name}_data/test.parquet lora.rank=0 \
  optim.lr=5e-5 optim.lr_warmup_steps=10 trainer.total_training_steps=200 trainer.test_freq=100 \
  trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 eval.max_new_tokens=16 trainer.seed=2 >> $R/$name.log 2>&1
python -m ragen.eval --config-name sokoban model_path=$R/$name trainer.val_seed=113000000 \
  es_manager.val.env_groups=128 $N hydra.run.dir=$R/${name}_test113 > $R/${name}_test113.log 2>&1
echo "$name done $(date)"; grep -A1 '^env ' $R/${name}_test113.log | tail -1
