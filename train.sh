#!/usr/bin/env bash
# Train an agent on one environment recipe, with Hydra overrides:
#   bash train.sh sokoban trainer.total_training_steps=200 algorithm.adv_estimator=grpo
# Recipes are the YAML files in config/ (sokoban, bandit, ...); every key is documented in
# ragen/config.py and verl/trainer/config.py.
set -euo pipefail
configs="$(dirname "$0")/config"
recipe=${1:-}
if [[ -z $recipe || ! -f $configs/$recipe.yaml || $recipe == base ]]; then
    echo "usage: bash train.sh <recipe> [key=value ...]" >&2
    echo "recipes: $(ls "$configs"/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | grep -vx base | tr '\n' ' ')" >&2
    exit 2
fi
shift
exec python -m ragen.train --config-name "$recipe" "$@"
