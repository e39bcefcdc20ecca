# one call on a fresh device: wheels, then the multi-turn rollout benchmark on a tiny random model (carried in
# .gguf/tiny), RL's shape 8 x 16, 10 one-move turns of <= 16 tokens: where does a turn's time go on CUDA?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi -L
timeout ${T:-200} python3 scripts/benchmark_rollout.py --engine torch hf --model .gguf/tiny --groups 8 --group-size 16 \
  --turns 10 --response-length 16 --prefix-cache on off 2>&1 | grep -v "Loading weights\|Writing model" | tee $OUT/bench.log
