# device call 3, on the same warm machine right after device_run.sh (its models in /tmp/g): the same evaluations on
# 64 more levels (Sokoban from 98,000,000) and maps (FrozenLake from 96,000,000), which no run or choice had used.
# As run (one command line in the call); its copying step failed under `set -f`, and the folders /tmp/g/x_* were
# fetched by a fourth call: cd /tmp/g && tar czf $OUT/x.tgz --exclude='*.safetensors' x_*
set -u; export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAGEN_CACHE=/tmp/ragen_cache; R=/tmp/g; T0=$SECONDS; set -f; C=custom_envs.CoordSokoban; F=custom_envs.CoordFrozenLake
run() { n=$1; rec=$2; m=$3; v=$4; shift 4; ( timeout 200 python3 -m ragen.eval --config-name $rec model_path=$m es_manager.val.env_groups=64 trainer.val_seed=$v "$@" hydra.run.dir=$R/x_$n > $OUT/$n.log 2>&1; cp $R/x_$n/metrics.json $OUT/${n}_metrics.json; gzip -c $R/x_$n/trajectories.jsonl > $OUT/$n.jsonl.gz; echo "$n $((SECONDS-T0)) s: $(grep -A1 '^env ' $OUT/$n.log | tail -1)" ) & }
run sok_coord sokoban $R/sok1 98000000
run sok_vocab sokoban $R/sok1 98000000 +$C.env_config.symbols=W.T*BAa
run sok_vocabtag sokoban $R/sok1 98000000 es_manager.val.env_configs.tags=[SokobanDifferentGridVocab]
run sok_deep sokoban $R/sok1 98000000 +$C.env_config.search_depth=100 $C.max_actions_per_traj=20 agent_proxy.max_turn=20
run sok_grid sokoban $R/sok1 98000000 $C.env_config.observation_format=grid
run sok_coordonly sokoban $R/sok1 98000000 $C.env_config.observation_format=coord
run sok_plaingrid sokoban $R/sok1 98000000 $C.env_config.observation_format=grid $C.env_config.cell_separator=''
run fl_coord frozen_lake $R/fl1 96000000
run fl_grid frozen_lake $R/fl1 96000000 $F.env_config.observation_format=grid
run fl_coordonly frozen_lake $R/fl1 96000000 $F.env_config.observation_format=coord
run fl_plaingrid frozen_lake $R/fl1 96000000 $F.env_config.observation_format=grid $F.env_config.cell_separator=''
wait
