#!/usr/bin/env bash
# The basic sets plus the research variants: larger and harder Sokoban rooms (multi-box), another grid
# vocabulary, a larger FrozenLake, and the bandit with unseen arm names (BanditTest).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ragen.create_data \
    --tags SimpleSokoban LargerSokoban HardSokoban SokobanDifferentGridVocab \
           FrozenLake LargerFrozenLake Bandit BanditTest Countdown \
    --train-size 10000 --test-size 100 --seed 10000 --output data "$@"
