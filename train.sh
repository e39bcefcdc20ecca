#!/usr/bin/env bash
# Train an agent on one environment recipe, with Hydra overrides:
#   bash train.sh sokoban trainer.total_training_steps=200 algorithm.adv_estimator=grpo
# Recipes are the YAML files in config/ (sokoban, bandit, ...); every key is documented in
# ragen/config.py and verl/trainer/config.py.
# RAGEN's first form, `bash ./train.sh` with settings in environment variables (DIM_X ... NUM_BOXES, BASE_MODEL,
# ...), trains the sokoban recipe with those settings translated (docs/old-ragen.md).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
configs="$(dirname "$0")/config"
recipe=${1:-}
# the old form sets the Sokoban room (DIM_X ...): other old names (EXPERIMENT_NAME, N_GPUS) are too common
if [[ -z $recipe || $recipe == *=* ]] && [[ -n ${DIM_X:-}${DIM_Y:-}${NUM_BOXES:-}${MAX_STEPS:-}${SEARCH_DEPTH:-} ]]; then
    legacy=$(python -m ragen.overrides --from-env)  # a variable it refuses stops here, with its message
    mapfile -t legacy <<< "$legacy"  # one override a line
    exec python -m ragen.train --config-name sokoban "${legacy[@]}" "$@"
fi
if [[ $recipe == sft ]]; then  # config/sft.yaml configures the SFT trainer, not an RL run
    echo "sft is not an RL recipe: the supervised warm start is bash sft/finetune_lora.sh <env> <ranks> <save_path>" \
         "(docs/sft.md)" >&2
    exit 2
fi
recipes=$(ls "$configs"/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | grep -vx -e base -e sft | tr '\n' ' ')
if [[ -n $recipe && $recipe != *=* && ( ! -f $configs/$recipe.yaml || $recipe == base ) ]]; then
    near=$(python3 -c 'import difflib, sys; print(" ".join(difflib.get_close_matches(sys.argv[1], sys.argv[2:], 1, 0.5)))' \
        "$recipe" $recipes)
    echo "unknown recipe '$recipe'${near:+ (did you mean $near?)}; the recipes: $recipes" >&2
    exit 2
fi
if [[ -z $recipe || ! -f $configs/$recipe.yaml ]]; then
    echo "usage: bash train.sh <recipe> [key=value ...]" >&2
    echo "recipes: $recipes" >&2
    exit 2
fi
shift
exec python -m ragen.train --config-name "$recipe" "$@"
