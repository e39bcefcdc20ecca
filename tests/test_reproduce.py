"""scripts/reproduce.py's summary: before/after per tag over seeds, echo-trap signal means, and its figures."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)


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
                      "train": reproduce.success_curves(rows, "train"), "wall_time_s": 60.0, "rows": rows}
    args = argparse.Namespace(val_seed=5_000_000, val_groups=64, overrides=[])
    summary = reproduce.summarise(runs, "bandit", args)

    row = summary["val_success"]["Bandit"]
    assert row["before"] == [0.5, 0.5] and row["after"] == [1.0, 0.0] and row["after_mean"] == 0.5
    assert abs(row["after_std"] - 2 ** 0.5 / 2) < 1e-12  # sample std of {1, 0}
    assert summary["signals"][1]["actor/entropy"] == (1.0, 0.2)
    assert summary["signals"][2]["actor/entropy"] == (1.0, 0.4)
    assert "rollout/reward_std" not in summary["signals"][1]  # never logged: no entry, no crash

    text = reproduce.markdown(summary)
    assert "| Bandit | 0.500 | 0.500 ± 0.707 | 1.000, 0.000 |" in text
    assert "| 1 | 1.00 -> 0.20 | - | 0.20 -> 0.20 | 0.50 -> 0.50 |" in text

    reproduce.plot(runs, tmp_path / "curve.png", "bandit")
    reproduce.plot_signals(runs, tmp_path / "signals.png", "bandit")
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "signals.png").stat().st_size > 0


def test_an_interrupted_run_resumes_and_a_changed_command_starts_anew(tmp_path, monkeypatch, capsys):
    # A stand-in for train.sh: the first sitting dies after writing a "checkpoint"; a later one finds it and ends.
    script = ("import pathlib, sys; ckpt = pathlib.Path(sys.argv[1]) / 'global_step_1'\n"
              "sys.exit(0) if ckpt.exists() else (ckpt.mkdir(), sys.exit(1))")
    monkeypatch.setattr(reproduce, "run_command",
                        lambda recipe, seed, run_dir, val_seed, overrides: [sys.executable, "-c", script, str(run_dir),
                                                                             *overrides])
    args = argparse.Namespace(val_seed=5_000_000, save_freq=1)
    run_dir = tmp_path / "runs" / "seed_1"

    with pytest.raises(SystemExit, match="resumes it"):
        reproduce.train("bandit", 1, run_dir, args, ["a=1"])
    assert (run_dir / "global_step_1").is_dir() and not (run_dir / "reproduce.json").exists()

    wall = reproduce.train("bandit", 1, run_dir, args, ["a=1"])  # same command: continues, keeps the checkpoint
    assert "resuming the interrupted run" in capsys.readouterr().out
    assert (run_dir / "reproduce.json").is_file() and not (run_dir / "global_step_1").exists()  # weights removed
    assert wall == json.loads((run_dir / "reproduce.json").read_text())["wall_time_s"] > 0

    assert reproduce.train("bandit", 1, run_dir, args, ["a=1"]) == wall  # finished: read back
    assert "reusing the finished run" in capsys.readouterr().out

    with pytest.raises(SystemExit):  # another command: the old run is wiped, so the stand-in starts over
        reproduce.train("bandit", 1, run_dir, args, ["a=2"])
    assert not (run_dir / "reproduce.json").exists()
