#!/usr/bin/env bash
# Publish a shared_randomness run's records into public/frozen_lake_crn_cpu/: bash publish_crn.sh [SEED] (default 1).
set -e
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
S=${1:-1}
R=results/frozen_lake_crn/runs/seed_$S; P=public/frozen_lake_crn_cpu; C=public/frozen_lake_cpu
mkdir -p $P
cp $R/metrics.jsonl $P/rl_seed${S}_metrics.jsonl
for f in $R/rollouts/val/step_*.jsonl; do n=$(basename $f .jsonl); n=${n#step_}
  gzip -c $f > $P/val_135000000_seed${S}_step_$n.jsonl.gz
  python scripts/map_dependence.py $P/val_135000000_seed${S}_step_$n.jsonl.gz --recipe frozen_lake es_manager.train.shared_randomness=true \
    $([ $n != 0 ] && echo --against $P/val_135000000_seed${S}_step_0.jsonl.gz) --json $P/map_dependence_seed${S}_step_$n.json \
    > $P/map_dependence_seed${S}_step_$n.txt
  # the independent-slips run exists for seed 1 only
  if [ $n != 0 ] && [ -f $C/val_135000000_seed${S}_step_$n.jsonl.gz ]; then
    python scripts/map_dependence.py $P/val_135000000_seed${S}_step_$n.jsonl.gz --against $C/val_135000000_seed${S}_step_$n.jsonl.gz \
      --json $P/vs_independent_step_$n.json > $P/vs_independent_step_$n.txt
  fi
done
T=$R/test/137000000x128
if [ -f $T/after/trajectories.jsonl ]; then
  gzip -c $T/after/trajectories.jsonl > $P/test_137000000_seed${S}_after.jsonl.gz
  # seed 1's "before" is the shared warm start, evaluated in results/frozen_lake_cpu; other seeds evaluate their own
  B=$C/test_137000000_seed${S}_before.jsonl.gz
  if [ ! -f $B ]; then
    B=$P/test_137000000_seed${S}_before.jsonl.gz; gzip -c $T/before/trajectories.jsonl > $B
    python scripts/map_dependence.py $B --json $P/map_dependence_seed${S}_test_before.json > $P/map_dependence_seed${S}_test_before.txt
  fi
  python scripts/map_dependence.py $P/test_137000000_seed${S}_after.jsonl.gz --against $B \
    --json $P/map_dependence_seed${S}_test_after.json > $P/map_dependence_seed${S}_test_after.txt
  if [ -f $C/test_137000000_seed${S}_after.jsonl.gz ]; then
    python scripts/map_dependence.py $P/test_137000000_seed${S}_after.jsonl.gz --against $C/test_137000000_seed${S}_after.jsonl.gz \
      --json $P/vs_independent_test_after.json > $P/vs_independent_test_after.txt
  fi
fi
tail -qn2 $P/*seed${S}*.txt
