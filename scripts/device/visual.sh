# device call 2 (from the repo root, after setup.sh on the same warm machine), prepared for the next lent GPU:
#   END=540 bash scripts/device/visual.sh        (timeout_s 595; carry [".gguf/part2.gz", ".gguf/commit.txt"])
# Issue 35's visual agent, from the bundled SmolLM2-135M-Instruct, training seed 1: sft/vision_align.sh's stage 1
# (cells), then sft/warm_start.sh sokoban on pictures alone (VIS_LEVELS expert levels, default 4,000: the picture
# data is slower to make), then greedy on 64 levels from 97,000,000 and 98,000,000 (the text warm start of seed 1:
# 87.5 / 92.2 % on an H100, public/boards_not_trained_on_h100). The GPU tests run beside.
# Everything written goes to one archive, $OUT/result.tgz (a call returns a few files only); a watchdog stops the
# jobs at END - 30 s. DRY=1 runs it here on CPU (with tiny settings, e.g. VIS_SFT/ALIGN_ARGS/VALG).
source scripts/device/environment.sh  # the GGUF joined, the carried wheels on the path
R=${R:-/tmp/g}; O=$R/out; mkdir -p $O/visual; T0=$SECONDS; END=${END:-540}; VALG=${VALG:-64}
C=custom_envs.CoordSokoban
evals() {  # $1: model, $2: out dir name, $3: overrides for all; stdin: lines "name val_seed overrides..."; all at once
  set -f  # overrides hold [ ] and *: no globbing
  while read -r name v overrides; do
    [ -z "$name" ] && continue
    ( python3 -m ragen.eval --config-name sokoban model_path=$1 es_manager.val.env_groups=$VALG trainer.val_seed=$v \
        $3 $overrides hydra.run.dir=$R/$2_$name > $O/$2/$name.log 2>&1
      cp $R/$2_$name/metrics.json $O/$2/${name}_metrics.json; gzip -c $R/$2_$name/trajectories.jsonl > $O/$2/$name.jsonl.gz
      echo "$2 $name at $((SECONDS - T0)) s: $(grep -A1 '^env ' $O/$2/$name.log | tail -1)" ) &
  done
  wait
}
visual() {
  bash sft/vision_align.sh sokoban $R/vlm --cell-steps 100 --steps 0 ${ALIGN_ARGS:-} > $O/visual/align.log 2>&1
  cp $R/vlm/model/score.json $O/visual/align_score.json; echo "alignment done at $((SECONDS - T0)) s"
  bash sft/warm_start.sh sokoban $R/vis1 model_path=$R/vlm/model +$C.env_config.image_observation=alone \
    --train-size=${VIS_LEVELS:-4000} trainer.seed=1 trainer.micro_batch_size_per_gpu=32 ${VIS_SFT:-} > $O/visual/warm1.log 2>&1
  cp $R/vis1/metrics.jsonl $O/visual/warm1_metrics.jsonl; echo "visual warm start done at $((SECONDS - T0)) s: $(tail -1 $O/visual/warm1.log)"
  evals $R/vis1 visual "+$C.env_config.image_observation=alone" <<LIST
pictures_97M 97000000
pictures_98M 98000000
LIST
}
PIDS=""
[ -z "${DRY:-}" ] && { ( timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $O/gpu_tests.log 2>&1; echo "gpu tests rc $? at $((SECONDS - T0)) s" >> $O/gpu_tests.log ) & PIDS="$PIDS $!"; }
visual & PIDS="$PIDS $!"
( sleep $((END - 30)); echo "watchdog at $((SECONDS - T0)) s"; pkill -f ragen.sft; pkill -f ragen.eval; pkill -f pytest ) &
WD=$!
wait $PIDS; kill $WD 2>/dev/null; echo "all done at $((SECONDS - T0)) s"
tail -n 3 $O/gpu_tests.log 2>/dev/null
for f in $O/*/*_metrics.json; do echo "$f: $(python3 -c "import json; d=json.load(open('$f')); print({k: round(v, 3) for k, v in d.items() if 'success' in k})")"; done
tar czf $OUT/result.tgz -C $R out; ls -la $OUT
