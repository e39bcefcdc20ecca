# device call 2 (from the repo root, after setup.sh on the same warm machine):
#   END=560 bash scripts/device/window_noise.sh        (timeout_s 595; carry [".gguf/part2.gz", ".gguf/commit.txt"])
# Issue 31: every greedy failure of the Sokoban warm start is a loop on one state, mostly a move that changes nothing
# (into a wall) repeated until the action budget ends. With the current state alone in the prompt (context window 1)
# the prompt after such a move is the prompt before it, so no data can teach what follows it. Two levers, both on
# the default warm start (sft/warm_start.sh sokoban: 8,000 expert levels, 700 steps of 32):
#   a: a context window of 2 turns (agent_proxy.max_context_window=2): the last move and the state before it shown;
#   b: the same window with DART noise (--noise=0.2): a fifth of the expert's moves replaced by random ones, so the
#      data holds moves into walls and off the expert's path, and the expert's way back after each.
# Training seeds A_SEEDS of a and B_SEEDS of b at once (each makes its own data: the same rows, ~1 min), then each model greedy on 64
# levels from 91,000,000 (where the window-1 default scored 84.4 / 85.9 / 81.2 % in seeds 1-3 on an H100) and 64
# from 119,000,000 (used by nothing before). GPU tests beside. The SFT runs stop at END - EVAL_S (their last save,
# every 100 steps, is what gets evaluated; its step is logged); a watchdog stops everything at END - 20 s.
# Everything written goes to $OUT/result.tgz. DRY=1 runs it here on CPU with tiny settings, e.g.
#   DRY=1 OUT=/tmp/o LEVELS=30 VALG=2 SFT="trainer.total_training_steps=4 trainer.test_freq=2" bash scripts/device/window_noise.sh
source scripts/device/environment.sh  # the GGUF joined, the carried wheels on the path
R=${R:-/tmp/w}; O=$R/out; mkdir -p $O; T0=$SECONDS; END=${END:-560}; VALG=${VALG:-64}; EVAL_S=${EVAL_S:-120}
A_SEEDS=${A_SEEDS:-"1 2"}; B_SEEDS=${B_SEEDS:-"1 2 3"}; VALS=${VALS:-"91000000 119000000"}
WINDOW=agent_proxy.max_context_window=2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-3}  # several processes share the cores
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a $O/progress.log; }

warm() {  # $1: lever (a|b), $2: training seed, then the data options
  local lever=$1 seed=$2; shift 2; local out=$R/$lever$seed
  timeout $((END - EVAL_S - (SECONDS - T0))) bash sft/warm_start.sh sokoban $out "$@" $WINDOW trainer.seed=$seed \
    trainer.micro_batch_size_per_gpu=32 ${SFT:-} > $O/sft_$lever$seed.log 2>&1
  local rc=$?
  cp $out/metrics.jsonl $O/sft_${lever}${seed}_metrics.jsonl 2>/dev/null
  local step=$(python3 -c "import json; print(json.load(open('$out/sft_state.json')).get('step'))" 2>/dev/null)
  log "$lever$seed: warm start ended (rc $rc), last save at step ${step:-none}: held-out expert moves $(python3 -c "import json
rows = [json.loads(l) for l in open('$out/metrics.jsonl') if 'val/action_accuracy' in l]
print([(r['step'], round(r['val/action_accuracy'], 3)) for r in rows])" 2>/dev/null)"
  [ -f $out/config.json ] || return
  for v in $VALS; do
    ( set -f; python3 -m ragen.eval --config-name sokoban model_path=$out es_manager.val.env_groups=$VALG \
        trainer.val_seed=$v $WINDOW hydra.run.dir=$R/eval_$lever${seed}_$v > $O/eval_$lever${seed}_$v.log 2>&1
      cp $R/eval_$lever${seed}_$v/metrics.json $O/eval_$lever${seed}_${v}_metrics.json
      gzip -c $R/eval_$lever${seed}_$v/trajectories.jsonl > $O/eval_$lever${seed}_$v.jsonl.gz
      log "$lever$seed (step $step) on $VALG levels from $v: $(grep -A1 '^env ' $O/eval_$lever${seed}_$v.log | tail -1)" ) &
  done
  wait
}

PIDS=""
[ -z "${DRY:-}" ] && { ( timeout 240 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $O/gpu_tests.log 2>&1
                         log "gpu tests rc $?: $(tail -1 $O/gpu_tests.log)" ) & PIDS="$PIDS $!"; }
for seed in $A_SEEDS; do warm a $seed --train-size=${LEVELS:-8000} & PIDS="$PIDS $!"; done
for seed in $B_SEEDS; do warm b $seed --train-size=${LEVELS:-8000} --noise=0.2 & PIDS="$PIDS $!"; done
( sleep $((END - 20)); log "watchdog"; pkill -f ragen.sft; pkill -f ragen.eval; pkill -f pytest ) &
WD=$!
wait $PIDS; pkill -P $WD; kill $WD 2>/dev/null; log "all done"  # the watchdog's sleep too
[ -z "${DRY:-}" ] && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> $O/progress.log
tar czf $OUT/result.tgz -C $R out; ls -la $OUT
