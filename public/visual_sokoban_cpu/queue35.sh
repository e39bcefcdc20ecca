#!/usr/bin/env bash
# Issue 35 queue (2026-12-06): after the text twin, the visual warm start at 250 steps again, its evaluation on a fresh
# set too (141,000,000), then RL on pictures from it (the sokoban recipe, 10 steps) and its evaluation.
set -uo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
while [ ! -f $R/text250.done ]; do sleep 20; done
date
bash public/visual_sokoban_cpu/run250.sh
date
PIC=+custom_envs.CoordSokoban.env_config.image_observation=alone
evaluate() {  # model, tag, seed, extra
    python -m ragen.eval --config-name sokoban model_path=$1 $4 es_manager.val.env_groups=128 trainer.val_seed=$3 \
        hydra.run.dir=$R/eval_$2_$3 > $R/eval_$2_$3.log 2>&1
    echo "$2 $3: $(tail -2 $R/eval_$2_$3.log | tr '\n' ' ')"
}
evaluate $R/text250 text250 141000000 ""
for SEED in 113000000 141000000; do evaluate $R/warm250 pic250 $SEED $PIC; done
date
bash train.sh sokoban model_path=$R/warm250 $PIC trainer.default_local_dir=$R/rl_pic \
    trainer.total_training_steps=10 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=5 \
    "trainer.logger=[console,jsonl]" > $R/rl_pic.log 2>&1
date
for SEED in 113000000 141000000; do evaluate $R/rl_pic/global_step_10 pic250rl10 $SEED $PIC; done
date
echo done > $R/queue35.done
