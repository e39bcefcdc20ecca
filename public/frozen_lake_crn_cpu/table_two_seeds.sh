#!/usr/bin/env bash
# The two-seed row of the shared-slips recipe, once seed 2's run has finished in results/frozen_lake_crn:
# seed 1's published record put back (its run folder was lost), the table of both written by reproduce.py, and
# copied to public/results/frozen_lake_crn_cpu/ for scripts/results_table.py.
set -euo pipefail
cd /work/main; . .venv/bin/activate; export HF_HUB_OFFLINE=1
O=results/frozen_lake_crn
[ -f $O/runs/seed_2.reproduce.json ] || { echo "seed 2 has not finished in $O" >&2; exit 1; }
[ -f $O/runs/seed_1.reproduce.json ] || python public/frozen_lake_crn_cpu/restore_seed1.py $O
python scripts/reproduce.py frozen_lake --table --seeds 1 2 --warm-start --warm-start-arg=--train-size=2000 \
  --warm-start-arg=trainer.total_training_steps=400 --warm-start-arg=trainer.train_batch_size=16 \
  --val-seed 135000000 --test-seed 137000000 --test-groups 128 --out $O es_manager.train.shared_randomness=true
cp $O/results.json $O/results.md $O/curve.png public/results/frozen_lake_crn_cpu/
python scripts/results_table.py
