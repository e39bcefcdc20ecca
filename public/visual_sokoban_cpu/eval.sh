#!/usr/bin/env bash
# Greedy evaluation on 64 Sokoban levels from 97,000,000: eval.sh <model> <name> [overrides...]
set -euo pipefail
cd /work/main
. .venv/bin/activate
export HF_HUB_OFFLINE=1
MODEL=$1; NAME=$2; shift 2
python -m ragen.eval --config-name sokoban model_path=$MODEL es_manager.val.env_groups=64 trainer.val_seed=97000000 \
    hydra.run.dir=results/visual/eval_$NAME "$@" > results/visual/eval_$NAME.log 2>&1
tail -20 results/visual/eval_$NAME.log
