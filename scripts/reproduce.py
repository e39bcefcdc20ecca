"""Reproduce a recipe's learning result: `python scripts/reproduce.py bandit [--seeds 1 2 3] [key=value ...]`.

For each training seed S the recipe is trained from scratch exactly as `bash train.sh <recipe>` would, with
`trainer.seed=S`, and validated (greedy, before training and every `trainer.test_freq` steps) on
`--val-groups` fixed start states per validation tag, drawn from `--val-seed` on: the same states for every
seed and never trained on. Pick a `--val-seed` no tuning run has seen to check a recipe honestly.

Writes to `--out` (default `results/<recipe>`):
- `runs/seed_<S>/`: each run (metrics.jsonl, rollouts, plots, the last checkpoint's weights are removed);
- `runs/seed_<S>_model/`: with `--keep-model`, that run's trained policy (a model folder for `model_path=`);
- `results.md` and `results.json`: per validation tag, success before and after training, mean and standard
  deviation over the seeds and each seed's value, and the wall time per run;
- `curve.png`: validation success against the training step, the seeds' mean with their min-max band, and
  the training success of each seed;
- `signals.png`: the echo-trap signals of each seed against the step (policy entropy, reward std over the
  batch and within groups, 4-gram repetition of the replies); results.md gives their early and late means.
Extra `key=value` arguments go to every run (e.g. `trainer.total_training_steps=10`). With `--warm-start`, each seed's
RL run starts from its own warm start, `bash sft/warm_start.sh <recipe>` with `trainer.seed=S` and each
`--warm-start-arg` (written to `runs/warm_seed_<S>/`, skipped when a finished one is there, also one copied from
another `--out` made by the same arguments, to compare RL levers from one warm start; an interrupted one goes on
from its last save), so "before" in the table is the warm start's validation and "after" the RL's, on the same
start states. A seed whose run already
finished in `--out` with the same command (its `reproduce.json` says so) is read back, not trained again. A run
that was interrupted (killed, or the laptop shut) with the same command resumes from its newest checkpoint
(written every `--save-freq` steps, only the newest kept) and replays exactly what an uninterrupted run does,
so a reproduction longer than one sitting can be run in pieces, on the same kind of machine: each sitting's code
and compute dtype are recorded (`code`, `dtypes` in results.json), and a sitting whose `auto` dtype differs from
the earlier ones' (bf16 on a GPU or a CPU with fast bf16, else fp32) says so. A different command starts the seed anew.
Seeds may run at once in separate processes (`--seeds 1`, `--seeds 2`, ... with the same `--out` and
arguments; each trains only its own seed, and its table of that seed alone is replaced later), after which
`--seeds 1 2 ...` reads them back and writes the table of all. `--table` trains nothing and writes the table from
the runs already in `--out`, interrupted ones included up to their last validation (results.json lists them under
"interrupted"): for runs cut short, or made on another machine (name it with `--machine`).

The validation states are watched while runs are made, so a recipe chosen by them has seen them. `--test-seed T`
also tests, once each run has finished, the model it started from and its last checkpoint (greedy, as validated) on
`--test-groups` start states per tag from T on, which nothing was validated on: the independent re-run of a
result (`runs/seed_<S>/test/{before,after}/`: metrics.json, trajectories.jsonl; a "test" table in results.md).
Small boards repeat across seeds, so with a warm start the test's success is also split by whether each board
was among the warm start's training boards (`unseen_boards` in results.json, scripts/seen_boards.py);
`--test-new-boards` tests instead on boards that no run trained or was validated on, each once (the first such seeds
from T on: `start_seeds` in results.json), beside the reference agents on those same boards.
"""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from ragen.overrides import load_config
from ragen.plot import read_metrics, series
from verl.utils.checkpoint import latest_checkpoint
from verl.utils.model import ModelNotFoundError, checkpoint_model, resolve_dtype

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = {"actor/entropy": "policy entropy (nats)", "rollout/reward_std": "reward std (batch)",
           "rollout/in_group_std": "reward std within groups", "rollout/response_repetition": "4-gram repetition"}
STOP_GRACE_S = 180  # an interrupted stage's time to finish a checkpoint and stop its Ray workers
_spec = importlib.util.spec_from_file_location("seen_boards", Path(__file__).with_name("seen_boards.py"))
seen_boards = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seen_boards)


def run_stage(command: list[str], log) -> int:
    """Run a stage (the warm start, a training run) in its own process group and return its exit code. If this
    script is interrupted (Ctrl-C, SIGTERM: see main), the stage gets what Ctrl-C would give it, SIGINT to its
    whole group, and STOP_GRACE_S to stop cleanly (the trainer shuts Ray down; killed outright, it left Ray's
    agents running), then is killed; the interruption is raised again. Being in its own session, the stage is
    not reached by signals to this script's group: `timeout -k` must allow more than STOP_GRACE_S."""
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        return process.wait()
    except BaseException:
        signal_group(process, signal.SIGINT)
        print(f"[reproduce] stopping the stage (up to {STOP_GRACE_S} s; Ctrl-C again kills it now)", flush=True)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except BaseException:  # the grace ran out, or a second Ctrl-C or SIGTERM came
            signal_group(process, signal.SIGKILL)
            process.wait()
        raise


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Send `signum` to the process group of `process` (a stage started in its own session), if it still runs."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:  # it ended in between
            pass


def run_command(recipe: str, seed: int, run_dir: Path, val_seed: int, overrides: list[str]) -> list[str]:
    return ["bash", str(ROOT / "train.sh"), recipe, f"trainer.seed={seed}", f"trainer.val_seed={val_seed}",
            f"trainer.experiment_name={recipe}_seed{seed}", f"trainer.default_local_dir={run_dir}",
            "trainer.val_before_train=true", f"logging.log_image_dir={run_dir / 'trajectories'}", *overrides]


def warm_start(recipe: str, seed: int, folder: Path, extra: list[str]) -> Path:
    """The seed's warm start (sft/warm_start.sh with the `extra` arguments), made once: `warm_start.json` marks a
    finished one. One made by the same command into another folder and copied here is reused too, so that RL
    levers are compared from one warm start (`cp -r <out>/runs/warm_seed_<S> <other out>/runs/`)."""
    done = folder / "warm_start.json"
    head, tail = ["bash", str(ROOT / "sft" / "warm_start.sh"), recipe], [f"trainer.seed={seed}", *extra]
    command = [*head, str(folder), *tail]
    recorded = json.loads(done.read_text(encoding="utf-8"))["command"] if done.is_file() else None
    if recorded is not None and recorded[:len(head)] == head and recorded[len(head) + 1:] == tail:  # in any folder
        print(f"[reproduce] seed {seed}: reusing the warm start in {folder}", flush=True)
        return folder
    print(f"[reproduce] {' '.join(command)}", flush=True)
    start = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"warm_seed_{seed}.log", "a", encoding="utf-8") as log:
        returncode = run_stage(command, log)
    if returncode != 0:
        sys.exit(f"[reproduce] the warm start of seed {seed} failed (exit {returncode}): see {log.name}")
    done.write_text(json.dumps({"command": command, "wall_time_s": time.time() - start}), encoding="utf-8")
    return folder


def train(recipe: str, seed: int, run_dir: Path, args, overrides: list[str]) -> dict:
    """One training run; returns its record (`<run_dir>.reproduce.json`): the command, the wall time in seconds
    over all its sittings, and the code and the compute dtype each sitting ran (`code_version`, `compute_dtype`)."""
    command = run_command(recipe, seed, run_dir, args.val_seed, overrides)
    done, started = bookkeeping(run_dir)
    if done.is_file() and json.loads(done.read_text(encoding="utf-8"))["command"] == command:
        print(f"[reproduce] seed {seed}: reusing the finished run in {run_dir}", flush=True)
        record = json.loads(done.read_text(encoding="utf-8"))
        test = record.get("test")
        if test and not test.get("new_boards") and "unseen_boards" not in test:  # recorded before the split existed
            add_unseen_boards(record["test"], recipe, run_dir, overrides)
        if getattr(args, "keep_model", False) and "model" not in record:
            print(f"[reproduce] seed {seed}: --keep-model keeps nothing: the run finished without it and its "
                  "weights were removed", flush=True)
        return record
    # The wall time of earlier sittings of this run is kept in command.json and added up.
    earlier = json.loads(started.read_text(encoding="utf-8")) if started.is_file() else {}
    if earlier.get("command") == command and any(run_dir.glob("global_step_*/trainer_state.json")):
        print(f"[reproduce] seed {seed}: resuming the interrupted run in {run_dir}", flush=True)
    else:  # a different command, none yet, or one interrupted before its first checkpoint: start anew
        shutil.rmtree(run_dir, ignore_errors=True)  # this script's own run folder (a run starts in an empty one)
        shutil.rmtree(kept_model(run_dir), ignore_errors=True)  # and the policy an earlier command kept
        done.unlink(missing_ok=True)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        earlier = {"command": command, "wall_time_s": earlier.get("wall_time_s", 0.0)
                   if earlier.get("command") == command else 0.0, "code": []}
        # now, so that even a killed sitting is resumed, not wiped
        started.write_text(json.dumps(earlier), encoding="utf-8")
    version = code_version()  # each sitting's code: a run resumed after a change is seen to have mixed code
    if version not in earlier.setdefault("code", []):
        earlier["code"].append(version)
        started.write_text(json.dumps(earlier), encoding="utf-8")
    dtype = compute_dtype(recipe, overrides)  # and its dtype: `auto` is bf16 or fp32 by the machine a sitting is on
    if dtype not in earlier.setdefault("dtypes", []):
        if earlier["dtypes"]:
            print(f"[reproduce] seed {seed}: this sitting computes in {dtype}, earlier ones in "
                  f"{', '.join(earlier['dtypes'])}: the run mixes dtypes (actor_rollout_ref.model.dtype and "
                  "actor_rollout_ref.rollout.dtype set one for every machine)", flush=True)
        earlier["dtypes"].append(dtype)
        started.write_text(json.dumps(earlier), encoding="utf-8")
    print(f"[reproduce] {' '.join(command)}", flush=True)
    start = time.time()
    with open(run_dir.parent / f"seed_{seed}.log", "a", encoding="utf-8") as log:
        checkpoints = [f"trainer.save_freq={args.save_freq}", "trainer.max_actor_ckpt_to_keep=1"]
        try:  # on an exception (Ctrl-C, SIGTERM: see main) run_stage stops the trainer before raising
            returncode = run_stage(command + checkpoints, log)
        finally:  # interrupted or not, the time spent counts towards this run
            wall = earlier["wall_time_s"] + time.time() - start
            started.write_text(json.dumps(earlier | {"wall_time_s": wall}), encoding="utf-8")
    if returncode != 0:
        sys.exit(f"[reproduce] the run with seed {seed} failed (exit {returncode}): see {log.name}; the same "
                 "command resumes it from its newest checkpoint")
    record = {"wall_time_s": wall, "command": command, "code": earlier["code"], "dtypes": earlier["dtypes"]}
    if getattr(args, "test_seed", None) is not None:
        record["test"] = final_test(recipe, run_dir, args, overrides)
    if getattr(args, "keep_model", False):
        record["model"] = str(keep_model(run_dir))
    for checkpoint in run_dir.glob("global_step_*"):  # the weights are not needed for the table; keep disk small
        shutil.rmtree(checkpoint)
    done.write_text(json.dumps(record), encoding="utf-8")
    return record


def kept_model(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + "_model")


def keep_model(run_dir: Path) -> Path:
    """The last checkpoint's policy as a model folder beside the run (`<run>_model`, what `model_path=` and
    `ragen.eval` load; its optimizer state left out), for tests on other start states after the run."""
    last = latest_checkpoint(run_dir)
    if last is None:
        sys.exit(f"[reproduce] no checkpoint in {run_dir} to keep")
    try:
        policy = checkpoint_model(last)  # the actor, or a LoRA run's merged export
    except ModelNotFoundError as error:
        sys.exit(f"[reproduce] --keep-model: {error}")
    if not (policy / "config.json").is_file():
        sys.exit(f"[reproduce] --keep-model: no model folder (config.json) in {last}")
    kept, partial = kept_model(run_dir), run_dir.with_name(run_dir.name + "_model.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(policy, partial, ignore=shutil.ignore_patterns("train_state_*"))
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)  # whole or not at all, even if this script is killed meanwhile
    print(f"[reproduce] kept the trained policy in {kept}", flush=True)
    return kept


def final_test(recipe: str, run_dir: Path, args, overrides: list[str]) -> dict:
    """{"test_seed", "test_groups", "before"|"after": {tag: greedy success}}: the model the run started from (its
    `model_path` override, or the recipe's) and the run's last checkpoint, each evaluated by `ragen.eval` with the
    run's overrides on `args.test_groups` start states per tag from `args.test_seed` (in
    `run_dir/test/<seed>x<groups>/`). An evaluation already written there (an interrupted test) is read back.
    With `args.test_new_boards`, the start states are the boards no run trained or was validated on
    (`new_board_seeds`; "new_boards" and "start_seeds" in the record, in `<seed>x<groups>_new/`)."""
    n_tags = len(validation_tags(recipe, overrides))
    last = latest_checkpoint(run_dir)
    if last is None:
        sys.exit(f"[reproduce] no checkpoint in {run_dir} to test")
    kept = [o for o in overrides if not o.startswith(("es_manager.val.env_groups=", "model_path="))]
    start = [o for o in overrides if o.startswith("model_path=")]
    models = {"before": start, "after": [f"model_path={last}"]}
    test = {"test_seed": args.test_seed, "test_groups": args.test_groups}
    states, folder = [f"trainer.val_seed={args.test_seed}"], f"{args.test_seed}x{args.test_groups}"
    if getattr(args, "test_new_boards", False):
        seeds = new_board_seeds(recipe, kept, Path(start[0].split("=", 1)[1]) if start else None, args)
        test |= {"new_boards": True, "start_seeds": seeds}
        states, folder = [f"es_manager.val.seeds=[{','.join(map(str, seeds))}]"], folder + "_new"
        picked = run_dir / "test" / folder / "start_seeds.json"
        if picked.is_file() and json.loads(picked.read_text(encoding="utf-8")) != seeds:  # an earlier sitting's boards
            print(f"[reproduce] the boards picked for {picked.parent} changed: testing anew", flush=True)
            shutil.rmtree(picked.parent)
        picked.parent.mkdir(parents=True, exist_ok=True)
        picked.write_text(json.dumps(seeds), encoding="utf-8")
    for name, model in models.items():
        out = run_dir / "test" / folder / name
        metrics = evaluate(recipe, [*kept, *model, *states, f"es_manager.val.env_groups={args.test_groups * n_tags}"],
                           out, out.parent / f"{name}.log")
        test[name] = {key.split("/")[1]: value for key, value in metrics.items()
                      if key.startswith("val-env/") and key.endswith("/success")}
    if not test.get("new_boards"):
        add_unseen_boards(test, recipe, run_dir, overrides)
    print(f"[reproduce] test on {args.test_groups} start states per tag from {args.test_seed}"
          f"{' (boards no run saw)' if test.get('new_boards') else ''}: "
          + ", ".join(f"{tag} {test['before'][tag]:.3f} -> {test['after'][tag]:.3f}" for tag in test["after"]),
          flush=True)
    return test


def new_board_seeds(recipe: str, overrides: list[str], model_dir: Path | None, args) -> list[int]:
    """The test's start seeds when it is on new boards: from `args.test_seed` on, `args.test_groups` a validation
    tag, each a board that is in none of these, nor an earlier pick (scripts/seen_boards.py's pick_unseen): the
    expert data of the model the runs start from (`<model_dir>/data/train.parquet`, as sft/warm_start.sh keeps
    it), the RL start states of every seed in `args.seeds` (the same for all of them where their warm starts
    share their data, as sft/warm_start.sh's do), and the validation states. A curriculum's other levels at
    those seeds, and the start states a watchdog rollback moved RL to, are not counted."""
    cfg = load_config(recipe, overrides)
    groups, steps = cfg.es_manager.train.env_groups, cfg.trainer.total_training_steps
    train_seeds = [range(seed + groups, seed + (steps + 1) * groups) for seed in getattr(args, "seeds", [cfg.trainer.seed])]
    val_groups = getattr(args, "val_groups", cfg.es_manager.val.env_groups) * len(cfg.es_manager.val.env_configs.tags)
    train_seeds.append(range(args.val_seed, args.val_seed + val_groups))
    if model_dir is not None:
        data = model_dir / "data" / "train.parquet"
        if data.is_file():
            train_seeds.append(sorted(set(pq.read_table(data, columns=["seed"]).column("seed").to_pylist())))
        else:
            print(f"[reproduce] warning: {model_dir} holds no data/train.parquet, so the boards the model was trained "
                  "on before these runs are not left out of the test", flush=True)
    tags = set(cfg.es_manager.val.env_configs.tags)
    boards = seen_boards.training_boards(cfg, tags, train_seeds)
    try:
        return seen_boards.pick_unseen(cfg, boards, args.test_seed, args.test_groups * len(tags))
    except ValueError as error:
        sys.exit(f"[reproduce] --test-new-boards: {error}")


def add_unseen_boards(test: dict, recipe: str, run_dir: Path, overrides: list[str]) -> None:
    """`test["unseen_boards"]` for a run that started from a warm start with its expert data (`unseen_boards`)."""
    start = [o.split("=", 1)[1] for o in overrides if o.startswith("model_path=")]
    kept = [o for o in overrides if not o.startswith(("es_manager.val.env_groups=", "model_path="))]
    split = unseen_boards(recipe, kept, Path(start[0]), run_dir / "test" / f"{test['test_seed']}x{test['test_groups']}") \
        if start else None
    if split is not None:
        test["unseen_boards"] = split


def unseen_boards(recipe: str, overrides: list[str], model_dir: Path, test_dir: Path) -> dict | None:
    """Success before and after on the test's start boards that were not among the training boards of the model
    the run started from (the seeds of its expert data, `<model_dir>/data/train.parquet`, as sft/warm_start.sh
    keeps it; None without one), and on those that were: small boards repeat across seeds
    (scripts/seen_boards.py). RL's own training start states are not counted: in the recipes here they lie
    among the expert data's seeds."""
    data = model_dir / "data" / "train.parquet"
    files = {name: test_dir / name / "trajectories.jsonl" for name in ("before", "after")}
    if not data.is_file() or not all(path.is_file() for path in files.values()):
        return None
    seeds = sorted(set(pq.read_table(data, columns=["seed"]).column("seed").to_pylist()))
    cfg = load_config(recipe, overrides)
    episodes = {name: seen_boards.map_dependence.read_episodes(path) for name, path in files.items()}
    boards = seen_boards.training_boards(cfg, {r["tag"] for records in episodes.values() for r in records}, [seeds])
    return {"training_seeds": len(seeds)} | {
        name: seen_boards.success_by_part(seen_boards.split_by_seen(records, cfg, boards))
        for name, records in episodes.items()}


def evaluate(recipe: str, overrides: list[str], out: Path, log_path: Path) -> dict:
    """`python -m ragen.eval --config-name <recipe> <overrides>` in `out` (its trajectories.jsonl and metrics.json),
    logged to `log_path`; returns the metrics. An evaluation already written in `out` is read back."""
    if not (out / "metrics.json").is_file():
        command = [sys.executable, "-m", "ragen.eval", "--config-name", recipe, *overrides, f"hydra.run.dir={out}"]
        print(f"[reproduce] evaluate: {' '.join(command)}", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            if run_stage(command, log) != 0:
                sys.exit(f"[reproduce] the evaluation in {out} failed: see {log_path}")
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def recorded_run(seed: int, run_dir: Path) -> dict:
    """The record of a run already in the output folder, for `--table`: the finished one's, else the interrupted
    one's so far (with "finished": False)."""
    done, started = bookkeeping(run_dir)
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    if started.is_file():
        return json.loads(started.read_text(encoding="utf-8")) | {"finished": False}
    sys.exit(f"[reproduce] seed {seed}: no run in {run_dir} to tabulate (--table trains nothing)")


def bookkeeping(run_dir: Path) -> tuple[Path, Path]:
    """(the finished run's record, the started run's command and wall time so far), beside the run folder:
    the trainer starts afresh only in an empty folder."""
    return run_dir.with_name(run_dir.name + ".reproduce.json"), run_dir.with_name(run_dir.name + ".command.json")


def success_curves(rows: list[dict], prefix: str) -> dict[str, dict[int, float]]:
    """{tag: {step: success}} from the metrics `<prefix>/<tag>/success` (val-env: validation, train: batches)."""
    curves: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(f"{prefix}/") and key.endswith("/success"):
                curves.setdefault(key.split("/")[1], {})[row["step"]] = value
    return curves


def signal_means(rows: list[dict], window: int = 5) -> dict[str, tuple[float, float]]:
    """{metric: (mean over the first `window` training steps, mean over the last `window`)} per echo-trap signal."""
    means = {}
    for key in SIGNALS:
        values = series(rows, key)[1]
        if values:
            means[key] = (statistics.mean(values[:window]), statistics.mean(values[-window:]))
    return means


def provenance(recipe: str, overrides: list[str], machine: str | None = None) -> dict:
    """What the table's numbers were measured with: the model, the machine (this one unless named), the day."""
    import torch

    if machine is None:
        machine = torch.cuda.get_device_name() if torch.cuda.is_available() else f"{len(os.sched_getaffinity(0))} CPU cores"
    return {"model": str(load_config(recipe, overrides).model_path), "machine": machine,
            "date": time.strftime("%Y-%m-%d")}


def compute_dtype(recipe: str, overrides: list[str]) -> str:
    """The actor's compute dtype on this machine for the recipe with `overrides` (`auto` made concrete)."""
    return resolve_dtype(str(load_config(recipe, overrides).actor_rollout_ref.model.dtype))


def code_version() -> str:
    """The checkout's commit, `-dirty` when files differ from it: what a sitting of a run trains with."""
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT,
                                   capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on this machine
        described = ""
    # a copy of the tree without its .git (a cluster node, a GPU machine) is named by whoever copied it
    return described or os.environ.get("RAGEN_CODE_VERSION") or "unknown (not a git checkout)"


def validation_baselines(recipe: str, overrides: list[str]) -> dict[str, dict]:
    """The reference agents (ragen/envs/baselines.py) on the runs' own validation start states, one episode
    each, as the policy is validated: per tag {"random": success, "constant": [best word, success] or None,
    "oracle": success or None}."""
    from ragen.env_state_manager import EnvStateManager
    from ragen.envs import baselines

    cfg = load_config(recipe, overrides)
    manager = EnvStateManager(cfg.es_manager.val, cfg.custom_envs, cfg.trainer.val_seed)
    seeds: dict[str, list[int]] = {}
    for state in manager.reset(0):  # validation always plays the start states of step 0
        seeds.setdefault(state.tag, []).append(state.seed)
    table = {}
    for tag, tag_seeds in seeds.items():
        env, budget = manager.env_per_tag()[tag], cfg.custom_envs[tag].max_actions_per_traj
        tag_seeds = sorted(set(tag_seeds))  # one episode per start state (a group shares its seed)
        constant = baselines.best_constant(env, tag_seeds, budget)
        table[tag] = {"random": baselines.evaluate(env, baselines.RandomAgent(0), tag_seeds, budget).success_rate,
                      "constant": [constant[0], constant[1].success_rate] if constant else None,
                      "oracle": baselines.evaluate(env, baselines.OracleAgent(0), tag_seeds, budget).success_rate
                      if baselines.has_oracle(env) else None}
    return table


def summarise(runs: dict[int, dict], recipe: str, args, baselines: dict[str, dict],
              test_baselines: dict[str, dict] | None = None) -> dict:
    """The results.json record; `baselines` from validation_baselines, on the same start states, and
    `test_baselines` on the test's (`--test-seed`; None: no test, no "test" entry)."""
    tags = sorted({tag for run in runs.values() for tag in run["val"]})
    table = {tag: success_row([run["val"][tag][min(run["val"][tag])] for run in runs.values()],
                              [run["val"][tag][max(run["val"][tag])] for run in runs.values()]) for tag in tags}
    summary = {"recipe": recipe, **provenance(recipe, args.overrides, getattr(args, "machine", None)), "seeds": list(runs), "val_seed": args.val_seed, "val_groups": args.val_groups,
            "overrides": args.overrides, "warm_start": getattr(args, "warm_start", False),
            "warm_start_args": getattr(args, "warm_start_args", []), "wall_time_s": {seed: run["wall_time_s"] for seed, run in runs.items()},
            "code": {seed: run["code"] for seed, run in runs.items()},
            "dtypes": {seed: run.get("dtypes", []) for seed, run in runs.items()},  # []: not recorded
            "steps": {seed: max(run["val"][tags[0]]) for seed, run in runs.items()}, "val_success": table,
            "interrupted": [seed for seed, run in runs.items() if not run.get("finished", True)],
            "baselines": baselines,
            "signals": {seed: signal_means(run["rows"]) for seed, run in runs.items()}}
    if test_baselines is None:
        return summary
    new_boards = getattr(args, "test_new_boards", False)
    tested = {seed: run["test"] for seed, run in runs.items() if run.get("test") and
              (run["test"]["test_seed"], run["test"]["test_groups"], run["test"].get("new_boards", False))
              == (args.test_seed, args.test_groups, new_boards)}
    if new_boards:  # one set of boards: the first tested run's (runs whose warm starts had other data picked others)
        first = next(iter(tested.values()), {}).get("start_seeds")
        tested = {seed: test for seed, test in tested.items() if test["start_seeds"] == first}
    success = {tag: success_row([t["before"][tag] for t in tested.values()], [t["after"][tag] for t in tested.values()])
               for tag in tags} if tested else {}
    summary["test"] = {"test_seed": args.test_seed, "test_groups": args.test_groups, "seeds": list(tested),
                       "untested": [seed for seed in runs if seed not in tested], "baselines": test_baselines,
                       "success": success}
    if new_boards:
        summary["test"] |= {"new_boards": True, "start_seeds": first}
    split = {seed: t["unseen_boards"] for seed, t in tested.items() if t.get("unseen_boards")}
    if split:
        summary["test"]["unseen_boards"] = split
    return summary


def success_row(before: list[float], after: list[float]) -> dict:
    """One tag's success before and after training, per seed, with the mean and sample std over seeds."""
    return {"before": before, "after": after, "after_mean": statistics.mean(after), "after_std": sample_std(after),
            "before_mean": statistics.mean(before), "before_std": sample_std(before)}


def sample_std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    lines = [f"# `{summary['recipe']}`: validation success (greedy) on {summary['val_groups']} start states per tag "
             f"from seed {summary['val_seed']}, training seeds {seeds}", "",
             "| tag | random | best constant move | oracle | before | after (mean ± sample std over seeds) | "
             "after, per seed |", "|---|---|---|---|---|---|---|"]
    for tag, row in summary["val_success"].items():
        per_seed = ", ".join(f"{v:.3f}" for v in row["after"])
        lines.append(f"| {tag} | {baseline_cells(summary['baselines'][tag])} | {row['before_mean']:.3f} | "
                     f"{row['after_mean']:.3f} ± {row['after_std']:.3f} | {per_seed} |")
    times = ", ".join(f"{t / 60:.1f}" for t in summary["wall_time_s"].values())
    stopped = summary.get("interrupted")
    lines += ["", f"Steps per run (the last validated): {sorted(set(summary['steps'].values()))}; "
              f"wall time per run (min): {times}."]
    if stopped:
        lines += [f"Interrupted before their last step, read up to their last validation: seeds {stopped}."]
    lines += test_markdown(summary["test"]) if "test" in summary else []
    lines += [
              f"Extra overrides: {summary['overrides'] or 'none'}.", "",
              "Echo-trap signals, mean of the first 5 training steps -> mean of the last 5:", "",
              "| seed | " + " | ".join(SIGNALS.values()) + " |", "|---" * (len(SIGNALS) + 1) + "|"]
    for seed, means in summary["signals"].items():
        cells = [f"{means[key][0]:.2f} -> {means[key][1]:.2f}" if key in means else "-" for key in SIGNALS]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def test_markdown(test: dict) -> list[str]:
    """The table of the final test (`--test-seed`), after the validation's."""
    states = (f"{test['test_groups']} start states per tag from seed {test['test_seed']} on whose boards no run "
              "trained or was validated on, each board once" if test.get("new_boards") else
              f"{test['test_groups']} start states per tag from seed {test['test_seed']} (never validated on)")
    lines = ["", f"## Test: the model each run started from and its last checkpoint, greedy, on {states}", ""]
    if test["untested"]:
        lines += [f"Not tested on these states (finished before `--test-seed` was given or tested on others, "
                  f"or not finished): seeds {test['untested']}.", ""]
    if not test["success"]:
        return lines
    lines += ["| tag | random | best constant move | oracle | before (mean ± std) | after (mean ± std) | "
              "before -> after, per seed |", "|---|---|---|---|---|---|---|"]
    for tag, row in test["success"].items():
        per_seed = ", ".join(f"{seed}: {b:.3f} -> {a:.3f}" for seed, b, a in zip(test["seeds"], row["before"], row["after"]))
        lines.append(f"| {tag} | {baseline_cells(test['baselines'][tag])} | {row['before_mean']:.3f} ± "
                     f"{row['before_std']:.3f} | {row['after_mean']:.3f} ± {row['after_std']:.3f} | {per_seed} |")
    if test.get("unseen_boards"):
        lines += ["", "Small boards repeat across seeds: split by whether a test board was among the warm start's "
                      "training boards (scripts/seen_boards.py), before -> after:", "",
                  "| seed | training seeds | seen in training: boards, success | not seen: boards, success |",
                  "|---|---|---|---|"]
        for seed, split in test["unseen_boards"].items():
            cells = [f"{split['after'][part]['episodes']}, " + (
                "-" if split["after"][part]["success"] is None else
                f"{split['before'][part]['success']:.3f} -> {split['after'][part]['success']:.3f}")
                for part in ("seen", "unseen")]
            lines.append(f"| {seed} | {split['training_seeds']} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def baseline_cells(base: dict) -> str:
    """The random, best constant move and oracle cells of a table row, from validation_baselines."""
    constant = f"{base['constant'][1]:.3f} ({base['constant'][0]})" if base["constant"] else "-"
    oracle = "-" if base["oracle"] is None else f"{base['oracle']:.3f}"
    return f"{base['random']:.3f} | {constant} | {oracle}"


def plot(runs: dict[int, dict], path: Path, recipe: str, baselines: dict[str, dict]) -> None:
    """Validation success per tag (the seeds' mean, their min-max band), each seed's training batches, and the
    reference agents on the same validation states (random dotted, best constant move dashed, oracle dash-dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = sorted({tag for run in runs.values() for tag in run["val"]})
    figure, axes = plt.subplots(figsize=(9.5, 4))
    for i, tag in enumerate(tags):
        steps = sorted(set.intersection(*(set(run["val"][tag]) for run in runs.values())))
        values = [[run["val"][tag][s] for run in runs.values()] for s in steps]
        axes.plot(steps, [statistics.mean(v) for v in values], color=f"C{i}", marker="o",
                  label=f"{tag} (validation, mean of {len(runs)} seeds)")
        axes.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=f"C{i}", alpha=0.2)
        for seed, run in runs.items():
            train_steps = sorted(run["train"].get(tag, {}))
            if train_steps:
                label = f"{tag} (training batches, per seed)" if seed == next(iter(runs)) else None
                axes.plot(train_steps, [run["train"][tag][s] for s in train_steps], color=f"C{i}", alpha=0.3,
                          linewidth=0.8, label=label)
        reference = baselines.get(tag, {})
        for agent, style in (("random", ":"), ("constant", "--"), ("oracle", "-.")):
            value = reference.get(agent)
            if value is not None:
                share, name = (value[1], f"best constant move ({value[0]})") if agent == "constant" else (value, agent)
                axes.axhline(share, color=f"C{i}", linestyle=style, linewidth=1, label=f"{tag}: {name}")
    axes.set(title=f"{recipe}: success rate", xlabel="training step", ylabel="success", ylim=(-0.03, 1.03))
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the plot, covering no line
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_signals(runs: dict[int, dict], path: Path, recipe: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, grid = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    for axes, (key, title) in zip(grid.flat, SIGNALS.items()):
        for seed, run in runs.items():
            steps, values = series(run["rows"], key)
            axes.plot(steps, values, label=f"seed {seed}")
        axes.set(title=title, xlabel="training step")
        axes.grid(alpha=0.3)
    grid.flat[0].legend(fontsize="small")
    figure.suptitle(f"{recipe}: echo-trap signals")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def validation_tags(recipe: str, overrides: list[str]) -> list[str]:
    """The recipe's validation tags, read from its composed config (no model is loaded)."""
    return list(load_config(recipe, overrides).es_manager.val.env_configs.tags)


def exit_on_sigterm() -> None:
    """`timeout`, a batch scheduler or `kill` stop a run with SIGTERM: exit as on Ctrl-C, so that the trainer is
    stopped and the sitting's wall time recorded; the same command goes on from the newest checkpoint. Ctrl-C
    works also where this script was started in the background of a shell, with SIGINT ignored, and the stages
    start with SIGINT at its default, so that run_stage can stop them with it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="a recipe of train.sh: bandit, frozen_lake, sokoban, countdown")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (trainer.seed)")
    parser.add_argument("--val-seed", type=int, default=5_000_000, help="first validation start state (seed)")
    parser.add_argument("--val-groups", type=int, default=64, help="validation start states per validation tag")
    parser.add_argument("--out", type=Path, help="output folder (default results/<recipe>)")
    parser.add_argument("--save-freq", type=int, default=1,
                        help="checkpoint every this many steps, so an interrupted run resumes (only the newest kept)")
    parser.add_argument("--warm-start", action="store_true",
                        help="start each seed's RL from its own sft/warm_start.sh model (made once per seed)")
    parser.add_argument("--warm-start-arg", action="append", default=[], metavar="ARG", dest="warm_start_args",
                        help="an argument of sft/warm_start.sh for every warm start: a key=value of the SFT trainer "
                        "(trainer.total_training_steps=200) or an option of its data (--warm-start-arg=--noise=0.2); "
                        "repeat it for several")
    parser.add_argument("--table", action="store_true",
                        help="train nothing: write the table from the runs in --out, finished or interrupted")
    parser.add_argument("--test-seed", type=int,
                        help="after each run, test its start model and last checkpoint on start states from this seed "
                        "(pick one that no run, validation or choice has used)")
    parser.add_argument("--test-groups", type=int, default=64, help="test start states per validation tag")
    parser.add_argument("--test-new-boards", action="store_true",
                        help="test on boards that none of the runs trained or was validated on, each board once: "
                        "the first such seeds from --test-seed on (small boards repeat across seeds)")
    parser.add_argument("--keep-model", action="store_true",
                        help="keep each finished run's trained policy in <out>/runs/seed_<N>_model (~0.5 GB for the "
                        "bundled model) to evaluate later on other start states; otherwise only the records stay")
    parser.add_argument("--machine", help="the machine the runs were made on, for the table (default: this one)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_intermixed_args()  # key=value overrides may follow the options
    if args.test_new_boards and args.test_seed is None:
        parser.error("--test-new-boards needs --test-seed (the first seed the test's boards are looked for from)")
    if any(o.startswith("es_manager.val.seeds=") for o in args.overrides):
        parser.error("es_manager.val.seeds: the validation and test states come from --val-seed and --test-seed "
                     "(--test-new-boards for boards no run saw)")
    out = (args.out or ROOT / "results" / args.recipe).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    n_tags = len(validation_tags(args.recipe, args.overrides))
    overrides = [f"es_manager.val.env_groups={args.val_groups * n_tags}", *args.overrides]
    runs = {}
    for seed in args.seeds:
        run_dir = out / "runs" / f"seed_{seed}"
        if args.table:
            record = recorded_run(seed, run_dir)
        else:
            seed_overrides = overrides
            if args.warm_start:
                model = warm_start(args.recipe, seed, out / "runs" / f"warm_seed_{seed}", args.warm_start_args)
                seed_overrides = [f"model_path={model}", *overrides]
            record = train(args.recipe, seed, run_dir, args, seed_overrides)
        wall = record["wall_time_s"]
        rows = read_metrics(run_dir)
        runs[seed] = {"val": success_curves(rows, "val-env"), "train": success_curves(rows, "train"),
                      "wall_time_s": wall, "rows": rows, "code": record["code"], "dtypes": record.get("dtypes", []),
                      "finished": record.get("finished", True), "test": record.get("test")}
        if not runs[seed]["val"]:
            sys.exit(f"[reproduce] seed {seed}: no validation in {run_dir}/metrics.jsonl yet, nothing to tabulate")
        changes = [f"{tag} {c[min(c)]:.3f} -> {c[max(c)]:.3f}" for tag, c in runs[seed]["val"].items()]
        print(f"[reproduce] seed {seed}: {wall / 60:.1f} min, validation success {', '.join(changes)}", flush=True)
    test_baselines = None
    if args.test_seed is not None:
        states = [f"trainer.val_seed={args.test_seed}", f"es_manager.val.env_groups={args.test_groups * n_tags}"]
        if args.test_new_boards:  # the boards of the first run tested on new ones (summarise keeps those runs)
            picked = [run["test"]["start_seeds"] for run in runs.values() if run["test"] and run["test"].get("new_boards")
                      and (run["test"]["test_seed"], run["test"]["test_groups"]) == (args.test_seed, args.test_groups)]
            states.append(f"es_manager.val.seeds=[{','.join(map(str, picked[0]))}]" if picked else "")
        test_baselines = validation_baselines(args.recipe, [*args.overrides, *states]) if all(states) else {}
    summary = summarise(runs, args.recipe, args,
                        validation_baselines(args.recipe, [f"trainer.val_seed={args.val_seed}", *overrides]),
                        test_baselines)
    (out / "results.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (out / "results.md").write_text(markdown(summary), encoding="utf-8")
    plot(runs, out / "curve.png", args.recipe, summary["baselines"])
    plot_signals(runs, out / "signals.png", args.recipe)
    print(markdown(summary) + f"\n[reproduce] written to {out}/results.md, results.json, curve.png, signals.png")


if __name__ == "__main__":
    main()
