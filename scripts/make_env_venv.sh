#!/usr/bin/env bash
# RAGEN's `bash scripts/make_env_venv.sh ENV_TYPE VENV_DIR`: a virtualenv that serves one environment type with
# `python -m ragen.envs.serve`, for an environment whose packages the training venv should not carry
# (gym-sokoban needs the old gym and setuptools<81). It holds the server's packages (gymnasium, numpy, fastapi,
# uvicorn at requirements.txt's versions, pydantic 2) and the environment's own; no torch, no transformers:
# a spawned server runs RAGEN's code from this checkout (PYTHONPATH). At the end it prints the overrides that
# run a custom_envs tag on it.
#   bash scripts/make_env_venv.sh gym_sokoban .venv-gym-sokoban
# ENV_TYPE: gym_sokoban, or one of RAGEN's own (bandit, countdown, frozen_lake, sokoban: the server alone).
# The venv is made with $PYTHON (default python3); an existing VENV_DIR is installed into again.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above is the usage
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [[ $# -ne 2 ]]; then
    echo "usage: bash scripts/make_env_venv.sh ENV_TYPE VENV_DIR (--help for more)" >&2
    exit 2
fi
env_type=$1
venv=$2
case $env_type in
    gym_sokoban)  # gym-sokoban imports pkg_resources, which setuptools 81 removed
        env_packages=("gym-sokoban==0.0.6" "setuptools<81"); tag=GymSokoban ;;
    bandit|countdown|frozen_lake|sokoban)
        env_packages=(); tag="<tag>" ;;
    *)
        echo "make_env_venv.sh: unknown env type '$env_type': give gym_sokoban, bandit, countdown, frozen_lake" \
            "or sokoban (a new env type with packages of its own gets a line in this script's case)" >&2
        exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
# the server's requirement lines, comments stripped: one place says which versions RAGEN works with
mapfile -t server_packages < <(grep -E '^(gymnasium|numpy|fastapi|uvicorn)[<>=!~ ]' "$repo/requirements.txt" \
    | sed 's/ *#.*//')
[[ ${#server_packages[@]} -eq 4 ]] || { echo "make_env_venv.sh: expected gymnasium, numpy, fastapi and uvicorn" \
    "lines in $repo/requirements.txt, found: ${server_packages[*]}" >&2; exit 1; }

set -x
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check "${server_packages[@]}" "pydantic>=2" \
    "${env_packages[@]}"
# the server imports, and an env builds and resets, with RAGEN's code from this checkout as a spawned server has it
PYTHONPATH=$repo "$venv/bin/python" -c "import ragen.envs.serve; from ragen.envs import make_env
make_env('$env_type').reset(seed=0)"
{ set +x; } 2>/dev/null

python=$(cd "$venv" && pwd)/bin/python
echo "[make_env_venv] $venv serves $env_type. Run a custom_envs tag of env_type $env_type on it with:"
echo "  custom_envs.$tag.server.spawn=true custom_envs.$tag.server.python=$python"
