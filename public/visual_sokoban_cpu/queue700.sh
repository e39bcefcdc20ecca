#!/usr/bin/env bash
# Issue 35 (2026-12-06 d): does a longer picture warm start play? Stage 1 (the vision side, 100 steps), then the
# per-move warm start on pictures alone for 700 steps of 16 (the text recipe's laptop warm start is 400; 250 gave
# 9-15 %), held-out expert moves every 100 steps; greedy on 128 levels from 113,000,000 and 141,000,000 (the text
# twin at 250 steps: 76.6 / 75.0 %); then the recipe's RL on pictures from it, 10 steps, and the same evaluation.
set -uo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
mkdir -p $R
PIC=+custom_envs.CoordSokoban.env_config.image_observation=alone
date
[ -f $R/vlm/model/score.json ] || bash sft/vision_align.sh sokoban $R/vlm --cell-steps 100 --steps 0 > $R/align.log 2>&1
date
[ -f $R/warm700.done ] || { bash sft/warm_start.sh sokoban $R/warm700 model_path=$R/vlm/model $PIC --train-size=2000 \
    trainer.total_training_steps=700 trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=8 \
    trainer.test_freq=100 eval.max_turns=64 > $R/warm700.log 2>&1 && echo done > $R/warm700.done; }
date
evaluate() {  # model, tag, seed (skipped when its metrics are there: the queue resumes)
    [ -f $R/eval_$2_$3/metrics.json ] || python -m ragen.eval --config-name sokoban model_path=$1 $PIC es_manager.val.env_groups=128 trainer.val_seed=$3 \
        hydra.run.dir=$R/eval_$2_$3 > $R/eval_$2_$3.log 2>&1
    echo "$2 $3: $(tail -2 $R/eval_$2_$3.log | tr '\n' ' ')"
}
for SEED in 141000000 113000000; do evaluate $R/warm700 pic700 $SEED; done
date
[ -d $R/rl_pic700/global_step_10 ] || bash train.sh sokoban model_path=$R/warm700 $PIC trainer.default_local_dir=$R/rl_pic700 \
    trainer.total_training_steps=10 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=5 \
    "trainer.logger=[console,jsonl]" > $R/rl_pic700.log 2>&1
date
for SEED in 141000000 113000000; do evaluate $R/rl_pic700/global_step_10 pic700rl10 $SEED; done
date
echo done > $R/queue700.done
