"""scripts/reproduce.py's summary: before/after per tag over seeds, echo-trap signal means, and its figures."""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)
compute_dtype = reproduce.compute_dtype


@pytest.fixture(autouse=True)
def stand_in_overrides_have_no_config(monkeypatch):
    """The stand-ins for train.sh below take overrides that are no recipe's keys: a sitting's dtype is fp32."""
    monkeypatch.setattr(reproduce, "compute_dtype", lambda recipe, overrides: "float32")


def test_a_sittings_dtype_is_the_recipes_made_concrete_here():
    assert compute_dtype("bandit", ["actor_rollout_ref.model.dtype=bfloat16"]) == "bfloat16"
    assert compute_dtype("bandit", []) == reproduce.resolve_dtype("auto") in ("bfloat16", "float32")


def fake_rows(final_success: float, entropy_end: float) -> list[dict]:
    rows = [{"step": 0, "val-env/Bandit/success": 0.5}]
    for step in range(1, 11):
        rows.append({"step": step, "train/Bandit/success": 0.1 * step,
                     "actor/entropy": 1.0 if step <= 5 else entropy_end,
                     "rollout/in_group_std": 0.2, "rollout/response_repetition": 0.5})
    rows[-1]["val-env/Bandit/success"] = final_success
    return rows


def test_summary_table_signals_and_figures(tmp_path):
    runs = {}
    for seed, (final, entropy_end) in {1: (1.0, 0.2), 2: (0.0, 0.4)}.items():
        rows = fake_rows(final, entropy_end)
        runs[seed] = {"val": reproduce.success_curves(rows, "val-env"),
                      "train": reproduce.success_curves(rows, "train"), "wall_time_s": 60.0, "rows": rows,
                      "code": ["abc1234"]}
    args = argparse.Namespace(val_seed=5_000_000, val_groups=64, overrides=[])
    summary = reproduce.summarise(runs, "bandit", args, {"Bandit": {"random": 0.5, "constant": None, "oracle": 1.0}})

    row = summary["val_success"]["Bandit"]
    assert row["before"] == [0.5, 0.5] and row["after"] == [1.0, 0.0] and row["after_mean"] == 0.5
    assert abs(row["after_std"] - 2 ** 0.5 / 2) < 1e-12  # sample std of {1, 0}
    assert summary["signals"][1]["actor/entropy"] == (1.0, 0.2)
    assert summary["signals"][2]["actor/entropy"] == (1.0, 0.4)
    assert "rollout/reward_std" not in summary["signals"][1]  # never logged: no entry, no crash

    text = reproduce.markdown(summary)
    assert "| Bandit | 0.500 | - | 1.000 | 0.500 | 0.500 ± 0.707 | 1.000, 0.000 |" in text
    assert "| 1 | 1.00 -> 0.20 | - | 0.20 -> 0.20 | 0.50 -> 0.50 |" in text

    reproduce.plot(runs, tmp_path / "curve.png", "bandit", summary["baselines"])
    reproduce.plot_signals(runs, tmp_path / "signals.png", "bandit")
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "signals.png").stat().st_size > 0


def test_baselines_play_the_validation_start_states():
    """The reference agents play exactly the states the runs are validated on: trainer.val_seed + group."""
    from ragen.envs import baselines

    table = reproduce.validation_baselines("frozen_lake", ["trainer.val_seed=700", "es_manager.val.env_groups=40"])
    env, budget = baselines.resolve_env("CoordFrozenLake")
    word, share = table["CoordFrozenLake"]["constant"]
    assert share == baselines.evaluate(env, baselines.ConstantAgent(word), range(700, 740), budget).success_rate
    assert share != baselines.evaluate(env, baselines.ConstantAgent(word), range(740, 780), budget).success_rate
    assert 0 <= table["CoordFrozenLake"]["random"] <= 1 and share < table["CoordFrozenLake"]["oracle"]
    assert reproduce.validation_baselines("bandit", ["es_manager.val.env_groups=8"])["BanditTest"]["constant"] is None


def test_an_interrupted_run_resumes_and_a_changed_command_starts_anew(tmp_path, monkeypatch, capsys):
    # A stand-in for train.sh: the first sitting dies after writing a "checkpoint"; a later one finds it and ends.
    script = ("import pathlib, sys; ckpt = pathlib.Path(sys.argv[1]) / 'global_step_1'\n"
              "sys.exit(0) if ckpt.exists() else (ckpt.mkdir(parents=True), (ckpt / 'trainer_state.json').touch(), "
              "sys.exit(1))")
    monkeypatch.setattr(reproduce, "run_command",
                        lambda recipe, seed, run_dir, val_seed, overrides: [sys.executable, "-c", script, str(run_dir),
                                                                             *overrides])
    args = argparse.Namespace(val_seed=5_000_000, save_freq=1)
    run_dir = tmp_path / "runs" / "seed_1"
    first = ["float32"]  # the first sitting on a CPU without fast bf16, the later ones on a CPU with it
    monkeypatch.setattr(reproduce, "compute_dtype", lambda recipe, overrides: first.pop() if first else "bfloat16")

    with pytest.raises(SystemExit, match="resumes it"):
        reproduce.train("bandit", 1, run_dir, args, ["a=1"])
    done, started = reproduce.bookkeeping(run_dir)
    assert (run_dir / "global_step_1").is_dir() and not done.exists()

    record = reproduce.train("bandit", 1, run_dir, args, ["a=1"])  # same command: continues, keeps the checkpoint
    out = capsys.readouterr().out
    assert "resuming the interrupted run" in out
    assert "this sitting computes in bfloat16, earlier ones in float32: the run mixes dtypes" in out
    assert done.is_file() and not (run_dir / "global_step_1").exists()  # weights removed
    assert record == json.loads(done.read_text()) and record["wall_time_s"] > 0
    assert record["code"] == [reproduce.code_version()]  # both sittings ran this checkout
    assert record["dtypes"] == ["float32", "bfloat16"]

    assert reproduce.train("bandit", 1, run_dir, args, ["a=1"]) == record  # finished: read back
    assert "reusing the finished run" in capsys.readouterr().out

    with pytest.raises(SystemExit):  # another command: the old run is wiped, so the stand-in starts over
        reproduce.train("bandit", 1, run_dir, args, ["a=2"])
    assert not done.exists()


def test_a_run_stopped_with_sigterm_stops_its_trainer_and_resumes(tmp_path, monkeypatch, capsys):
    """`timeout 8h python scripts/reproduce.py ...`: the SIGTERM must not lose the run (it once did: the command
    was recorded only after the trainer ended, so the next sitting wiped the run and started over)."""
    run_dir = tmp_path / "runs" / "seed_1"
    # A stand-in for train.sh: the first sitting writes a "checkpoint" and its pid, then trains "forever", and
    # stops as the trainer does on Ctrl-C, saying so.
    trainer = ("import os, pathlib, sys, time; run = pathlib.Path(sys.argv[1]); ckpt = run / 'global_step_1'\n"
               "if ckpt.exists(): sys.exit(0)\n"
               "ckpt.mkdir(parents=True); (ckpt / 'trainer_state.json').touch()\n"
               "(run / 'pid').write_text(str(os.getpid()))\n"
               "try:\n    time.sleep(120)\n"
               "except KeyboardInterrupt:\n    (run / 'stopped_cleanly').touch(); sys.exit(130)")
    driver = (f"import argparse, importlib.util, sys\n"
              f"path = {str(REPO / 'scripts' / 'reproduce.py')!r}\n"
              f"spec = importlib.util.spec_from_file_location('reproduce', path)\n"
              f"r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)\n"
              f"r.run_command = lambda *args: [sys.executable, '-c', {trainer!r}, {str(run_dir)!r}]\n"
              f"r.exit_on_sigterm()\n"
              f"r.train('bandit', 1, r.Path({str(run_dir)!r}), argparse.Namespace(val_seed=5, save_freq=1), [])\n")
    sitting = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO)
    deadline = time.time() + 60
    while not (run_dir / "pid").is_file() and time.time() < deadline:
        time.sleep(0.1)
    trainer_pid = int((run_dir / "pid").read_text())
    sitting.send_signal(signal.SIGTERM)
    assert sitting.wait(timeout=30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # the trainer was stopped (and reaped), not left running
        os.kill(trainer_pid, 0)
    assert (run_dir / "stopped_cleanly").is_file()  # by Ctrl-C's SIGINT, with time to stop Ray, not SIGKILL
    recorded = json.loads(reproduce.bookkeeping(run_dir)[1].read_text())
    assert recorded["wall_time_s"] > 0

    monkeypatch.setattr(reproduce, "run_command", lambda *args: recorded["command"])
    reproduce.train("bandit", 1, run_dir, argparse.Namespace(val_seed=5, save_freq=1), [])
    assert "resuming the interrupted run" in capsys.readouterr().out
    assert reproduce.bookkeeping(run_dir)[0].is_file()


def test_a_warm_start_is_made_once_per_seed_and_reused(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, log):
        calls.append(command)
        return 0

    monkeypatch.setattr(reproduce, "run_stage", fake_run)
    folder = reproduce.warm_start("sokoban", 2, tmp_path / "warm_seed_2", [])
    assert folder == tmp_path / "warm_seed_2" and len(calls) == 1
    assert calls[0][1].endswith("sft/warm_start.sh") and calls[0][2:] == ["sokoban", str(folder), "trainer.seed=2"]
    reproduce.warm_start("sokoban", 2, tmp_path / "warm_seed_2", [])  # finished: not made again
    assert len(calls) == 1
    copy = tmp_path / "other_out" / "warm_seed_2"  # copied into another --out folder: reused there
    shutil.copytree(folder, copy)
    assert reproduce.warm_start("sokoban", 2, copy, []) == copy and len(calls) == 1
    reproduce.warm_start("sokoban", 2, tmp_path / "warm_seed_2", ["--noise=0.2"])  # other arguments: made anew
    assert len(calls) == 2 and calls[1][-2:] == ["trainer.seed=2", "--noise=0.2"]
    reproduce.warm_start("sokoban", 3, copy, [])  # another seed: made anew, even in a folder with a warm start
    assert len(calls) == 3

    monkeypatch.setattr(reproduce, "run_stage", lambda command, log: 1)
    with pytest.raises(SystemExit, match="warm start of seed 3 failed"):
        reproduce.warm_start("sokoban", 3, tmp_path / "warm_seed_3", [])
    assert not (tmp_path / "warm_seed_3" / "warm_start.json").exists()  # the same command makes it again


def test_the_table_of_interrupted_runs_says_so(tmp_path):
    """`--table`: a run stopped before its end is read up to its last validation and listed as interrupted."""
    run_dir = tmp_path / "runs" / "seed_1"
    with pytest.raises(SystemExit, match="no run"):
        reproduce.recorded_run(1, run_dir)
    run_dir.mkdir(parents=True)
    started = reproduce.bookkeeping(run_dir)[1]
    started.write_text(json.dumps({"command": ["train.sh"], "wall_time_s": 300.0, "code": ["abc1234"]}))
    record = reproduce.recorded_run(1, run_dir)
    assert record["finished"] is False and record["wall_time_s"] == 300.0

    rows = [{"step": 0, "val-env/Bandit/success": 0.4}, {"step": 1, "train/Bandit/success": 0.5}]
    runs = {1: {"val": reproduce.success_curves(rows, "val-env"), "train": reproduce.success_curves(rows, "train"),
                "wall_time_s": 300.0, "rows": rows, "code": ["abc1234"], "finished": False},
            2: {"val": {"Bandit": {0: 0.3, 5: 0.6}}, "train": {}, "wall_time_s": 60.0, "rows": [], "code": ["x"]}}
    args = argparse.Namespace(val_seed=5, val_groups=64, overrides=[], machine="NVIDIA H100 80GB HBM3")
    summary = reproduce.summarise(runs, "bandit", args, {"Bandit": {"random": 0.5, "constant": None, "oracle": 1.0}})
    assert summary["interrupted"] == [1] and summary["steps"] == {1: 0, 2: 5}
    assert summary["machine"] == "NVIDIA H100 80GB HBM3"  # named, not this machine
    assert summary["val_success"]["Bandit"]["after"] == [0.4, 0.6]  # seed 1: its last validation, step 0
    assert "Interrupted before their last step, read up to their last validation: seeds [1]." in \
        reproduce.markdown(summary)


def test_keep_model_keeps_the_last_policy_without_its_optimizer_state(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "seed_1"
    trainer = ("import pathlib, sys\n"
               "for step in (3, 4):\n"
               "    actor = pathlib.Path(sys.argv[1]) / f'global_step_{step}' / 'actor'; actor.mkdir(parents=True)\n"
               "    (actor.parent / 'trainer_state.json').touch(); (actor / 'model.safetensors').write_text(str(step))\n"
               "    (actor / 'config.json').touch(); (actor / 'train_state_rank0.pt').touch()")
    monkeypatch.setattr(reproduce, "run_command",
                        lambda recipe, seed, run_dir, val_seed, overrides: [sys.executable, "-c", trainer, str(run_dir)])
    args = argparse.Namespace(val_seed=5, save_freq=1, keep_model=True)
    record = reproduce.train("bandit", 1, run_dir, args, [])
    kept = tmp_path / "runs" / "seed_1_model"
    assert record["model"] == str(kept) and sorted(p.name for p in kept.iterdir()) == ["config.json", "model.safetensors"]
    assert (kept / "model.safetensors").read_text() == "4"  # the last checkpoint's
    assert not list(run_dir.glob("global_step_*"))

    lora = tmp_path / "lora" / "global_step_2"  # an adapter without a merged export is no model to keep
    (lora / "actor").mkdir(parents=True)
    (lora / "trainer_state.json").touch()
    (lora / "actor" / "adapter_config.json").touch()
    with pytest.raises(SystemExit, match="lora.save_merged=true"):
        reproduce.keep_model(lora.parent)


def fake_trainer_and_eval(monkeypatch, metrics) -> list[list[str]]:
    """A trainer that writes a step-4 checkpoint, and a ragen.eval that writes `metrics(command)` as its
    metrics.json in hydra.run.dir; returns the list the evaluations' commands are appended to."""
    trainer = ("import pathlib, sys; ckpt = pathlib.Path(sys.argv[1]) / 'global_step_4'\n"
               "ckpt.mkdir(parents=True); (ckpt / 'trainer_state.json').touch()")
    monkeypatch.setattr(reproduce, "run_command",
                        lambda recipe, seed, run_dir, val_seed, overrides: [sys.executable, "-c", trainer, str(run_dir)])
    evaluations, real_run_stage = [], reproduce.run_stage

    def fake_eval(command, log):
        if "ragen.eval" not in command:
            return real_run_stage(command, log)
        evaluations.append(command)
        out = Path(next(c for c in command if c.startswith("hydra.run.dir=")).split("=", 1)[1])
        (out / "metrics.json").write_text(json.dumps(metrics(command)))
        return 0

    monkeypatch.setattr(reproduce, "run_stage", fake_eval)
    return evaluations


def test_a_finished_run_is_tested_on_other_start_states_before_its_weights_go(tmp_path, monkeypatch, capsys):
    """`--test-seed`: the start model and the last checkpoint, each evaluated once on the test's start states, in
    the run's own config; an evaluation already written is read back; the table gets a test section."""
    run_dir = tmp_path / "runs" / "seed_1"
    evaluations = fake_trainer_and_eval(monkeypatch, lambda command: {
        "val-env/Bandit/success": 1.0, "val-env/BanditTest/success": 0.25 if "model_path=/warm" in command else 0.75})
    args = argparse.Namespace(val_seed=5, save_freq=1, test_seed=9_000, test_groups=16)
    overrides = ["es_manager.val.env_groups=64", "model_path=/warm", "trainer.total_training_steps=4"]
    record = reproduce.train("bandit", 1, run_dir, args, overrides)

    assert record["test"] == {"test_seed": 9_000, "test_groups": 16, "before": {"Bandit": 1.0, "BanditTest": 0.25},
                              "after": {"Bandit": 1.0, "BanditTest": 0.75}}
    before, after = evaluations
    assert before[before.index("--config-name") + 1] == "bandit"
    for command in evaluations:  # the run's overrides, the test's states (16 per tag, 2 tags), the validation's gone
        assert {"trainer.total_training_steps=4", "trainer.val_seed=9000", "es_manager.val.env_groups=32"} <= set(command)
        assert "es_manager.val.env_groups=64" not in command
    assert "model_path=/warm" in before and f"model_path={run_dir / 'global_step_4'}" in after
    assert "model_path=/warm" not in after
    assert not (run_dir / "global_step_4").exists()  # tested, then removed
    assert "BanditTest 0.250 -> 0.750" in capsys.readouterr().out

    (run_dir / "global_step_4").mkdir()
    (run_dir / "global_step_4" / "trainer_state.json").touch()
    assert reproduce.final_test("bandit", run_dir, args, overrides) == record["test"]  # read back, not run again
    assert len(evaluations) == 2
    other = argparse.Namespace(test_seed=9_500, test_groups=16)  # other states: evaluated anew, nothing mixed in
    assert reproduce.final_test("bandit", run_dir, other, overrides)["test_seed"] == 9_500 and len(evaluations) == 4

    rows = fake_rows(1.0, 0.2)
    runs = {1: {"train": {}, "wall_time_s": 60.0, "rows": rows, "code": ["abc1234"], "test": record["test"]},
            2: {"train": {}, "wall_time_s": 60.0, "rows": rows, "code": ["abc1234"], "test": None}}
    base = {tag: {"random": 0.5, "constant": None, "oracle": 1.0} for tag in ("Bandit", "BanditTest")}
    val = {"Bandit": {0: 0.5, 10: 1.0}, "BanditTest": {0: 0.5, 10: 1.0}}
    runs[3] = runs[2] | {"test": record["test"] | {"test_seed": 9_500}}  # tested on other states
    summary = reproduce.summarise({seed: run | {"val": val} for seed, run in runs.items()}, "bandit",
                                  argparse.Namespace(val_seed=5, val_groups=64, overrides=[], test_seed=9_000,
                                                     test_groups=16), base, base)
    assert summary["test"]["seeds"] == [1] and summary["test"]["untested"] == [2, 3]
    assert summary["test"]["success"]["BanditTest"]["after"] == [0.75]
    text = reproduce.markdown(summary)
    assert "16 start states per tag from seed 9000" in text and "Not tested" in text
    assert "| BanditTest | 0.500 | - | 1.000 | 0.250 ± 0.000 | 0.750 ± 0.000 | 1: 0.250 -> 0.750 |" in text


def test_the_test_is_split_by_the_warm_start_training_boards(tmp_path):
    """A warm start's expert data names its training seeds; test boards among their boards are counted apart."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragen.envs.baselines import ConstantAgent
    from tests.test_map_dependence import OVERRIDES, play

    warm = tmp_path / "warm_seed_1"
    (warm / "data").mkdir(parents=True)
    pq.write_table(pa.table({"seed": list(range(300)) * 2}), warm / "data" / "train.parquet")  # a row per move
    test_dir = tmp_path / "test" / "9000x40"
    held_out = list(range(5_000_000, 5_000_040))
    for name, agent in (("before", ConstantAgent("Down")), ("after", ConstantAgent("Right"))):
        (test_dir / name).mkdir(parents=True)
        records = play(agent, held_out)
        (test_dir / name / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    split = reproduce.unseen_boards("frozen_lake", OVERRIDES, warm, test_dir)
    seen = split["after"]["seen"]["episodes"]
    assert split["training_seeds"] == 300 and 0 < seen < 40  # small maps repeat, and not all of them
    assert split["before"]["seen"]["episodes"] == seen and split["after"]["unseen"]["episodes"] == 40 - seen
    assert reproduce.unseen_boards("frozen_lake", OVERRIDES, tmp_path / "no_data", test_dir) is None

    test = {"test_seed": 9000, "test_groups": 40, "seeds": [1], "untested": [], "unseen_boards": {1: split},
            "success": {"CoordFrozenLake": reproduce.success_row([0.3], [0.4])},
            "baselines": {"CoordFrozenLake": {"random": 0.0, "constant": None, "oracle": 0.4}}}
    text = "\n".join(reproduce.test_markdown(test))
    assert "not seen: boards, success" in text and f"| 1 | 300 | {seen}, " in text


def test_a_test_on_new_boards_plays_boards_no_run_trained_or_validated_on(tmp_path, monkeypatch):
    """`--test-new-boards`: the test's seeds skip every board of the warm start's data, of the runs' RL start
    states and of the validation, and every board already picked; the table says which boards it played."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragen.envs import make_env
    from ragen.overrides import load_config

    warm = tmp_path / "warm_seed_1"
    (warm / "data").mkdir(parents=True)
    pq.write_table(pa.table({"seed": list(range(30))}), warm / "data" / "train.parquet")
    run_dir = tmp_path / "runs" / "seed_1"
    evaluations = fake_trainer_and_eval(monkeypatch, lambda command: {"val-env/CoordFrozenLake/success": 0.5})
    args = argparse.Namespace(val_seed=7_000_000, val_groups=16, save_freq=1, test_seed=9_000_000, test_groups=24,
                              test_new_boards=True, seeds=[8_999_996, 200_000])
    overrides = ["es_manager.val.env_groups=16", f"model_path={warm}", "trainer.total_training_steps=4"]
    test = reproduce.train("frozen_lake", 1, run_dir, args, overrides)["test"]

    seeds = test["start_seeds"]
    assert test["new_boards"] and len(seeds) == 24 and "unseen_boards" not in test
    for command in evaluations:
        assert f"es_manager.val.seeds=[{','.join(map(str, seeds))}]" in command
        assert "es_manager.val.env_groups=24" in command and "trainer.val_seed=9000000" not in command
        assert f"hydra.run.dir={run_dir / 'test' / '9000000x24_new'}" in " ".join(command)
    cfg = load_config("frozen_lake", [])
    spec = cfg.custom_envs["CoordFrozenLake"]
    env = make_env(spec.env_type, dict(spec.env_config))
    board = lambda seed: env.reset(seed=seed)[0]  # noqa: E731
    groups = cfg.es_manager.train.env_groups
    rl = [s for run in args.seeds for s in range(run + groups, run + 5 * groups)]  # steps 1..4
    assert groups == 4 and rl[:16] == list(range(9_000_000, 9_000_016))  # run 1's: where the test looks first
    used = [*range(30), *range(7_000_000, 7_000_016), *rl]
    assert not {board(seed) for seed in used} & {board(seed) for seed in seeds}
    assert len({board(seed) for seed in seeds}) == 24 and min(seeds) >= 9_000_000
    data_and_val = reproduce.seen_boards.training_boards(cfg, {"CoordFrozenLake"}, [range(30), range(7_000_000, 7_000_016)])
    without_rl = reproduce.seen_boards.pick_unseen(cfg, data_and_val, 9_000_000, 24)
    assert {board(seed) for seed in without_rl} & {board(seed) for seed in rl}  # so the RL start states were left out

    (run_dir / "global_step_4").mkdir()
    (run_dir / "global_step_4" / "trainer_state.json").touch()
    assert reproduce.final_test("frozen_lake", run_dir, args, overrides) == test and len(evaluations) == 2  # read back
    (run_dir / "test" / "9000000x24_new" / "start_seeds.json").write_text(json.dumps(seeds[::-1]))  # other boards
    assert reproduce.final_test("frozen_lake", run_dir, args, overrides) == test and len(evaluations) == 4  # anew

    runs = {1: {"train": {}, "wall_time_s": 60.0, "rows": fake_rows(1.0, 0.2), "code": ["abc1234"], "test": test,
                "val": {"CoordFrozenLake": {0: 0.5, 10: 0.5}}}}
    base = {"CoordFrozenLake": {"random": 0.0, "constant": None, "oracle": 0.5}}
    summary = reproduce.summarise(runs, "frozen_lake", argparse.Namespace(
        val_seed=7_000_000, val_groups=16, overrides=[], test_seed=9_000_000, test_groups=24, test_new_boards=True),
        base, base)
    assert summary["test"]["seeds"] == [1] and summary["test"]["start_seeds"] == seeds
    assert "whose boards no run trained or was validated on" in reproduce.markdown(summary)
    other = reproduce.summarise(runs, "frozen_lake", argparse.Namespace(  # a test on any boards is another test
        val_seed=7_000_000, val_groups=16, overrides=[], test_seed=9_000_000, test_groups=24), base, base)
    assert other["test"]["untested"] == [1]


def test_new_boards_need_a_test_seed_and_the_states_come_from_the_options(tmp_path):
    for extra, message in ((["--test-new-boards"], "--test-new-boards needs --test-seed"),
                           (["--test-seed", "9", "es_manager.val.seeds=[1]"], "come from --val-seed and --test-seed")):
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "reproduce.py"), "bandit", "--out", str(tmp_path),
                               *extra], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
