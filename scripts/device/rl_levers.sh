# device call 2 (from the repo root, after setup.sh on the same warm machine), prepared for the next lent GPU:
#   END=540 bash scripts/device/rl_levers.sh        (timeout_s 595; carry [".gguf/part2.gz", ".gguf/commit.txt"])
# Issue 31's open question: can RL add to the Sokoban warm start? Every RL run from it so far (RLOO at 8 x 16,
# T 1.0, 10-29 steps) left greedy validation where it was: the warm-started policy is near-deterministic (entropy
# ~0.02 nats a token), its failures are greedy loops on one state, and sampling escapes them only by chance.
# One warm start (seed 1, the laptop-sized recipe: 2,000 expert levels, 400 steps of 16), then the RL runs of
# LEVERS at once from it, each validated greedily on 64 levels from VAL (before RL and every 10 steps), then every
# run's last checkpoint on 64 levels from FRESH, which nothing else uses. A watchdog stops everything at END - 40 s.
# Everything written goes to $OUT/result.tgz. DRY=1 runs it here on CPU with tiny settings (SFT_STEPS, STEPS, VALG, G, N).
source scripts/device/environment.sh  # the GGUF joined, the carried wheels on the path
R=${R:-/tmp/l}; O=$R/out; mkdir -p $O; T0=$SECONDS; END=${END:-540}; VALG=${VALG:-64}
VAL=${VAL:-111000000}; FRESH=${FRESH:-115000000}
# name:overrides (commas for spaces); the control first: the recipe's own RL settings but lr 1e-5. Temperature stays
# 1.0: on the CPU-made warm start, 4 samples at 1.0 solved every greedy failure at least once, at 1.5 only 2 of 5.
# On 2 CPU cores (8 x 4, 40 steps) GiGPO with RAGEN-2's top_p filter took this warm start from 80.5 to 87.5 % of 128
# levels from 113,000,000, every failure left a repeated move into a wall: noop_reward -1 charges each such turn.
# FRESH: levels from 113,000,000 have been looked at since (the CPU test); 115,000,000 on are untouched.
LEVERS=${LEVERS:-"rloo:actor_rollout_ref.actor.optim.lr=1e-5
gigpo_top_p:actor_rollout_ref.actor.optim.lr=1e-5,algorithm.adv_estimator=gigpo,agent_proxy.use_turn_scores=true,actor_rollout_ref.rollout.rollout_filter_strategy=top_p,actor_rollout_ref.rollout.rollout_filter_value=0.9,actor_rollout_ref.rollout.rollout_filter_include_zero=false,actor_rollout_ref.rollout.rollout_filter_empty_stop_steps=0
gigpo_top_p_noop:actor_rollout_ref.actor.optim.lr=1e-5,algorithm.adv_estimator=gigpo,agent_proxy.use_turn_scores=true,actor_rollout_ref.rollout.rollout_filter_strategy=top_p,actor_rollout_ref.rollout.rollout_filter_value=0.9,actor_rollout_ref.rollout.rollout_filter_include_zero=false,actor_rollout_ref.rollout.rollout_filter_empty_stop_steps=0,+custom_envs.CoordSokoban.env_config.noop_reward=-1"}
( sleep $((END - 40)); echo "watchdog at $((SECONDS - T0)) s"; pkill -f ragen.sft; pkill -f ragen.train; pkill -f ragen.eval ) &
WD=$!
bash sft/warm_start.sh sokoban $R/warm --train-size=2000 trainer.seed=1 trainer.total_training_steps=${SFT_STEPS:-400} \
  trainer.train_batch_size=16 trainer.micro_batch_size_per_gpu=16 > $O/warm.log 2>&1
cp $R/warm/metrics.jsonl $O/warm_metrics.jsonl; echo "warm start done at $((SECONDS - T0)) s: $(tail -1 $O/warm.log)"
echo "$LEVERS" | while IFS=: read -r name overrides; do
  [ -z "$name" ] && continue
  ( set -f; bash train.sh sokoban model_path=$R/warm trainer.seed=1 trainer.val_seed=$VAL trainer.val_before_train=true \
      es_manager.val.env_groups=$VALG es_manager.train.env_groups=${G:-8} es_manager.train.group_size=${N:-16} \
      actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 trainer.backend=local trainer.save_freq=10 \
      trainer.max_actor_ckpt_to_keep=1 trainer.total_training_steps=${STEPS:-60} trainer.test_freq=10 \
      trainer.default_local_dir=$R/$name trainer.experiment_name=$name ${overrides//,/ } > $O/$name.log 2>&1
    echo "$name stopped at $((SECONDS - T0)) s" ) &
done
wait -n 2>/dev/null; sleep 1
while pgrep -f ragen.train > /dev/null; do sleep 5; done
for run in $R/*/metrics.jsonl; do d=$(dirname $run); cp $run $O/$(basename $d)_metrics.jsonl
  last=$(ls -d $d/global_step_* 2>/dev/null | sort -V | tail -1)
  [ -n "$last" ] && [ $((END - SECONDS + T0)) -gt 90 ] && ( set -f; timeout $((END - SECONDS + T0 - 45)) python3 -m ragen.eval \
    --config-name sokoban model_path=$last es_manager.val.env_groups=$VALG trainer.val_seed=$FRESH \
    hydra.run.dir=$R/eval_$(basename $d) > $O/eval_$(basename $d).log 2>&1; echo "$(basename $d) $(basename $last) on $FRESH: \
$(grep -A1 '^env ' $O/eval_$(basename $d).log | tail -1)" ) &
done
wait; kill $WD 2>/dev/null; echo "all done at $((SECONDS - T0)) s"
python3 - <<'EOF'
import glob, json, os
for path in sorted(glob.glob(os.environ.get("R", "/tmp/l") + "/out/*_metrics.jsonl")):
    rows = [json.loads(line) for line in open(path)]
    val = [(r["step"], round(r[k], 3)) for r in rows for k in r if k.startswith("val-env/") and k.endswith("/success")]
    train = [round(r["rollout/success_rate"], 2) for r in rows if "rollout/success_rate" in r]
    print(os.path.basename(path), "val", val, "train", train[:3], "...", train[-3:])
EOF
tar czf $OUT/result.tgz -C $R out; ls -la $OUT
