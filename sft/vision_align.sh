#!/usr/bin/env bash
# Eyes for the language model (issue 35): build a SmolVLM-style model from a language model and a fresh vision
# tower (python -m verl.utils.vlm, skipped when <output_dir>/base already holds one), then train its vision side on
# rendered boards, first each cell's image token against the language model's embedding of the cell's symbol, then
# against the board's coordinate text, the language model frozen (python -m ragen.sft.vision_align);
# the held-out reading before and after each stage is printed and saved to <output_dir>/model/score.json:
#   bash sft/vision_align.sh <env> <output_dir> [--option ...]
# e.g. bash sft/vision_align.sh sokoban models/sokoban-vlm --steps 200 --batch-size 8
# <env> is sokoban or frozen_lake; LM=<language model> picks the language model (default: the bundled one);
# the options are python -m ragen.sft.vision_align's (--cell-steps, --steps, --batch-size, --lr, --walk, ...).
# The aligned model (<output_dir>/model) is a model_path for sft/warm_start.sh and python -m ragen.eval on pictures.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [ $# -lt 2 ]; then
    echo "usage: bash sft/vision_align.sh <env> <output_dir> [--option ...]" >&2
    exit 2
fi
ENV_NAME=$1
OUTPUT=$2
shift 2
cd "$(dirname "$0")/.."
if [ ! -f "$OUTPUT/base/processor_config.json" ]; then  # one image token per 16-pixel cell: 6 x 6 or 4 x 4 boards
    case $ENV_NAME in frozen_lake) SIZE=64 ;; *) SIZE=96 ;; esac
    python -m verl.utils.vlm "${LM:-bundled:SmolLM2-135M-Instruct}" "$OUTPUT/base" --image-size "$SIZE"
fi
python -m ragen.sft.vision_align "$OUTPUT/base" "$OUTPUT/model" --env "$ENV_NAME" "$@"
