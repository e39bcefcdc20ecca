#!/usr/bin/env bash
# The RL-on-pictures checkpoint (step 10), evaluated as queue35.sh meant to; its processor_config.json copied from
# the warm start it began from (checkpoints did not yet save a VLM's processor: fixed after this run).
set -uo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
R=results/visual
PIC=+custom_envs.CoordSokoban.env_config.image_observation=alone
for SEED in 113000000 141000000; do
    python -m ragen.eval --config-name sokoban model_path=$R/rl_pic/global_step_10 $PIC es_manager.val.env_groups=128 \
        trainer.val_seed=$SEED hydra.run.dir=$R/eval_pic250rl10_$SEED > $R/eval_pic250rl10_$SEED.log 2>&1
    echo "pic250rl10 $SEED: $(tail -2 $R/eval_pic250rl10_$SEED.log | tr '\n' ' ')"
done
