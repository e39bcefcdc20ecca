# device call 2 (from the repo root, after setup.sh on the same warm machine):
#   END=560 bash scripts/device/warm_scale.sh        (timeout_s 595; carry [".gguf/part2.gz", ".gguf/commit.txt"])
# Run once on an H200 (2026-12-04, code 2ba2bb2): the expert data took 107 s (16 cores), the three warm starts
# ~0.6 s a step each side by side; the watchdogs then slept END - 110 s from the end of the data (fixed since: from
# the start), so the warm starts were stopped at steps 654-668 and evaluated, from their step-600 saves, in a
# follow-up call (public/sokoban_warm_start_h200_16k/). At that speed data (107 s), 700 steps (~430 s) and the
# evaluations (~70 s) overrun one call's 595 s: make the data in a call of its own first (it stays in /tmp while the
# machine is warm), or run two seeds per call.
# Issue 31: does the Sokoban warm start keep rising with scale? sft/warm_start.sh's earlier default (8,000 expert levels,
# 700 steps of 32, 3 seeds on an H100) solved 83.9 % +- 2.4 of the 64 levels from 91,000,000, against 75.0 % +- 3.1
# for a quarter of the levels and 2/7 of the samples. Here: twice the levels and twice the samples (16,000 levels,
# 700 steps of 64), 3 seeds at once, each then greedy on the same 64 levels from 91,000,000 and on 128 levels from
# 127,000,000 that nothing has used. The expert data is made once, in CHUNKS processes side by side, and is row for
# row what `bash sft/warm_start.sh sokoban <dir> --train-size=16000` makes (marked so that it reuses it). The GPU
# tests run beside the data generation. A watchdog stops the warm starts at END - 110 s (their last save, every 100
# steps, is then what is evaluated; sft_state.json names its step) and everything at END - 10 s.
# Everything written goes to $OUT/result.tgz. DRY=1 runs it here on CPU (tiny: LEVELS=128 SFT_ARGS=... VALG=2 ...).
source scripts/device/environment.sh  # the GGUF joined, the carried wheels on the path
R=${R:-/tmp/w}; O=$R/out; mkdir -p $O; T0=$SECONDS; END=${END:-560}
LEVELS=${LEVELS:-16000}; CHUNK=${CHUNK:-4032}; VALG=${VALG:-64}; TESTG=${TESTG:-128}
SFT_ARGS=${SFT_ARGS:-"trainer.total_training_steps=700 trainer.train_batch_size=64 trainer.micro_batch_size_per_gpu=64"}
[ -z "${DRY:-}" ] && { ( timeout 150 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $O/gpu_tests.log 2>&1
  echo "gpu tests rc $? at $((SECONDS - T0)) s" >> $O/gpu_tests.log ) & }
D=$R/data; mkdir -p $D; PIDS=""
for ((start = 0; start < LEVELS; start += CHUNK)); do  # chunks start on a multiple of 64, a rollout's batch
  size=$((LEVELS - start < CHUNK ? LEVELS - start : CHUNK)); test=$((start + size == LEVELS ? ${TEST_LEVELS:-64} : 0))
  python3 -m ragen.sft.data --env sokoban --seed $start --train-size $size --test-size $test --per-move \
    --output $D/chunk_$start > $O/data_$start.log 2>&1 & PIDS="$PIDS $!"
done
wait $PIDS  # not the GPU tests
python3 - "$D" <<'EOF'
import sys
from pathlib import Path
import pyarrow.parquet as pq
from ragen.create_data import write_parquet
from ragen.sft.data import appended
data = Path(sys.argv[1])
chunks = sorted(data.glob("chunk_*"), key=lambda p: int(p.name.split("_")[1]))
table = pq.read_table(chunks[0] / "train.parquet")
for chunk in chunks[1:]:
    table = appended(table, pq.read_table(chunk / "train.parquet"), chunk)
write_parquet(table, data / "train.parquet")
(data / "test.parquet").write_bytes((chunks[-1] / "test.parquet").read_bytes())
print(f"expert data: {table.num_rows} moves of {len(set(table.column('seed').to_pylist()))} levels")
EOF
echo "data done at $((SECONDS - T0)) s"; cat $O/data_*.log | grep parquet
( sleep $((END - 110 - SECONDS + T0)); echo "watchdog (warm starts) at $((SECONDS - T0)) s"; pkill -f ragen.sft.trainer ) &
WD1=$!
( sleep $((END - 10 - SECONDS + T0)); echo "watchdog (all) at $((SECONDS - T0)) s"; pkill -f ragen.eval ) &
WD2=$!
evaluate() {  # $1: seed, $2: name, $3: val seed, $4: levels
  ( set -f; timeout $((END - 12 - SECONDS + T0)) python3 -m ragen.eval --config-name sokoban model_path=$R/ws$1 \
      es_manager.val.env_groups=$4 trainer.val_seed=$3 hydra.run.dir=$R/eval_$1_$2 > $O/seed$1_$2.log 2>&1 )
  cp $R/eval_$1_$2/metrics.json $O/seed$1_$2_metrics.json; gzip -c $R/eval_$1_$2/trajectories.jsonl > $O/seed$1_$2.jsonl.gz
  echo "seed $1 $2 at $((SECONDS - T0)) s: $(grep -A1 '^env ' $O/seed$1_$2.log | tail -1)"
}
PIDS=""
for s in ${SEEDS:-1 2 3}; do
  ( mkdir -p $R/ws$s/data; cp $D/train.parquet $D/test.parquet $R/ws$s/data/
    # what sft/warm_start.sh writes beside the data it made: the same call then reuses it
    printf '%q ' --env sokoban --train-size 16000 --test-size 64 --per-move --output $R/ws$s/data --train-size=$LEVELS \
      > $R/ws$s/data/command.txt
    ( set -f; bash sft/warm_start.sh sokoban $R/ws$s --train-size=$LEVELS trainer.seed=$s $SFT_ARGS > $O/warm$s.log 2>&1 )
    echo "seed $s warm start ended at $((SECONDS - T0)) s: $(cat $R/ws$s/sft_state.json)"; cp $R/ws$s/metrics.jsonl $O/warm${s}_metrics.jsonl
    evaluate $s 91M 91000000 $VALG & evaluate $s 127M 127000000 $TESTG & wait ) & PIDS="$PIDS $!"
done
wait $PIDS; kill $WD1 $WD2 2>/dev/null; echo "all done at $((SECONDS - T0)) s"
grep -h "reusing" $O/warm*.log | head -3; tail -n 3 $O/gpu_tests.log 2>/dev/null
for f in $O/*_metrics.json; do echo "$f: $(python3 -c "import json; d=json.load(open('$f')); print({k: round(v, 3) for k, v in d.items() if 'success' in k})")"; done
tar czf $OUT/result.tgz -C $R out; ls -la $OUT
