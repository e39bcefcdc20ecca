#!/usr/bin/env bash
# Publish the shared_randomness run's records into public/frozen_lake_crn_cpu/.
set -e
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
R=results/frozen_lake_crn/runs/seed_1; P=public/frozen_lake_crn_cpu; C=public/frozen_lake_cpu
mkdir -p $P
cp $R/metrics.jsonl $P/rl_seed1_metrics.jsonl
for f in $R/rollouts/val/step_*.jsonl; do n=$(basename $f .jsonl); n=${n#step_}
  gzip -c $f > $P/val_135000000_seed1_step_$n.jsonl.gz
  python scripts/map_dependence.py $P/val_135000000_seed1_step_$n.jsonl.gz --recipe frozen_lake es_manager.train.shared_randomness=true \
    $([ $n != 0 ] && echo --against $P/val_135000000_seed1_step_0.jsonl.gz) --json $P/map_dependence_seed1_step_$n.json > $P/map_dependence_seed1_step_$n.txt
  [ $n != 0 ] && python scripts/map_dependence.py $P/val_135000000_seed1_step_$n.jsonl.gz --against $C/val_135000000_seed1_step_$n.jsonl.gz \
    --json $P/vs_independent_step_$n.json > $P/vs_independent_step_$n.txt
done
T=$R/test/137000000x128/after/trajectories.jsonl
if [ -f $T ]; then
  gzip -c $T > $P/test_137000000_seed1_after.jsonl.gz
  python scripts/map_dependence.py $P/test_137000000_seed1_after.jsonl.gz --against $C/test_137000000_seed1_before.jsonl.gz \
    --json $P/map_dependence_seed1_test_after.json > $P/map_dependence_seed1_test_after.txt
  python scripts/map_dependence.py $P/test_137000000_seed1_after.jsonl.gz --against $C/test_137000000_seed1_after.jsonl.gz \
    --json $P/vs_independent_test_after.json > $P/vs_independent_test_after.txt
fi
tail -qn2 $P/*.txt
