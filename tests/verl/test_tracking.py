"""Every logger gets every metric: JSONL, TensorBoard event files, wandb offline (no account); and the
learning-curve plots are drawn from the JSONL alone. Every file is strict UTF-8 JSON (null for NaN), a
fresh run starts metrics.jsonl anew, a resumed one drops the line its crash tore."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from ragen.plot import plot_run, read_metrics, series
from verl.utils.tracking import Tracking, write_jsonl

REPO = Path(__file__).resolve().parents[2]

METRICS = [{"train/Bandit/success": 0.25, "train/Bandit/reward": 0.1, "actor/entropy": 1.5,
            "rollout/reward_std": 0.3, "rollout/in_group_std": 0.2},
           {"train/Bandit/success": 0.5, "train/Bandit/reward": 0.4, "actor/entropy": 1.2,
            "rollout/reward_std": 0.25, "rollout/in_group_std": 0.1, "val-env/Bandit/success": 0.75}]


def test_jsonl_and_tensorboard_hold_every_metric_of_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking(["jsonl", "tensorboard"], str(tmp_path))
    for step, metrics in enumerate(METRICS, start=1):
        tracker.log(metrics, step)
    tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": step, **m} for step, m in enumerate(METRICS, start=1)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(METRICS[0]) | set(METRICS[1])
    assert [(e.step, e.value) for e in events.Scalars("train/Bandit/success")] == [(1, 0.25), (2, 0.5)]


def test_wandb_runs_offline_without_an_account(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracking(["wandb"], str(tmp_path), project="ragen-test", experiment="offline", config={"a": 1})
    for step, metrics in enumerate(METRICS, start=1):
        tracker.log(metrics, step)
    tracker.finish()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb")), "wandb wrote no offline run file"


def test_unknown_logger_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="supported"):
        Tracking(["mlflow"], str(tmp_path))


def test_plots_are_drawn_from_the_jsonl_alone(tmp_path):
    tracker = Tracking(["jsonl"], str(tmp_path))
    for step, metrics in enumerate(METRICS, start=1):
        tracker.log(metrics, step)
    paths = plot_run(tmp_path)
    assert sorted(p.name for p in paths) == ["collapse.png", "entropy.png", "reward.png", "reward_std.png",
                                             "success.png"]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == ((1900, 800) if path.name == "collapse.png" else (950, 400))


def test_plotting_a_folder_without_metrics_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)


def strict_rows(path) -> list[dict]:
    """Every line parsed as strict JSON: a bare NaN or Infinity, which json.loads accepts, fails."""
    def reject(constant):
        raise ValueError(f"{constant} is not JSON")

    return [json.loads(line, parse_constant=reject) for line in path.read_text(encoding="utf-8").splitlines()]


def test_non_finite_metrics_are_written_as_null(tmp_path):
    tracker = Tracking(["jsonl"], str(tmp_path))
    tracker.log({"actor/grad_norm": float("nan"), "actor/pg_loss": float("inf"), "actor/lr": 1e-6}, step=1)
    assert strict_rows(tmp_path / "metrics.jsonl") == [
        {"step": 1, "actor/grad_norm": None, "actor/pg_loss": None, "actor/lr": 1e-6}]


def test_records_keep_their_text_and_null_their_non_finite_numbers_at_any_depth(tmp_path):
    record = {"tag": "Sokoban", "reward": float("-inf"), "turns": [{"response": "ça va 🙂", "advantage": float("nan")}]}
    write_jsonl(tmp_path / "step_1.jsonl", [record])
    assert strict_rows(tmp_path / "step_1.jsonl") == [
        {"tag": "Sokoban", "reward": None, "turns": [{"response": "ça va 🙂", "advantage": None}]}]


OLD_RUN = '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a": 3.0}\n{"step": 4, "a": 4'  # killed in step 4


def test_a_fresh_run_in_a_used_folder_starts_metrics_anew(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(OLD_RUN, encoding="utf-8")
    tracker = Tracking(["jsonl"], str(tmp_path))
    tracker.log({"a": 0.5}, step=0)
    tracker.log({"a": 1.5}, step=1)
    assert strict_rows(tmp_path / "metrics.jsonl") == [{"step": 0, "a": 0.5}, {"step": 1, "a": 1.5}]


def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint_and_drops_the_torn_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(OLD_RUN, encoding="utf-8")
    tracker = Tracking(["jsonl"], str(tmp_path))
    tracker.truncate(after_step=2)
    tracker.log({"a": 30.0}, step=3)
    assert strict_rows(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0},
                                                       {"step": 3, "a": 30.0}]


def test_plots_skip_a_line_torn_mid_character_and_draw_nulls_as_gaps(tmp_path):
    rows = [{"step": 1, "actor/entropy": 1.5}, {"step": 2, "actor/entropy": None}, {"step": 3, "actor/entropy": 1.2}]
    torn = '{"step": 4, "train/Bandit/success": 0.5, "note": "é'.encode()[:-1]  # half of a 2-byte character
    (tmp_path / "metrics.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode() + torn)
    assert read_metrics(tmp_path) == rows
    assert series(rows, "actor/entropy")[0] == [1, 2, 3] and math.isnan(series(rows, "actor/entropy")[1][1])
    assert len(plot_run(tmp_path)) == 5


# ASCII source (a C locale cannot decode a non-ASCII command line): "naïve 🙂 ответ", "Café"
WRITE_UNDER_C_LOCALE = r"""
import sys
from verl.utils.tracking import Tracking, read_jsonl, write_jsonl
run_dir, text = sys.argv[1], "na\u00efve \U0001f642 \u043e\u0442\u0432\u0435\u0442"
write_jsonl(run_dir + "/rollouts/step_1.jsonl", [{"response": text}])
assert read_jsonl(run_dir + "/rollouts/step_1.jsonl") == [{"response": text}]
tracker = Tracking(["jsonl"], run_dir)
tracker.log({"train/Caf\u00e9/success": 1.0}, step=1)
tracker.truncate(after_step=1)
"""


def test_text_files_are_utf8_under_a_c_locale(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LANG", "LC_CTYPE")}
    env |= {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(REPO)}
    probe = subprocess.run([sys.executable, "-c", "import locale; print(locale.getpreferredencoding(False))"],
                           env=env, capture_output=True, text=True, check=True)
    assert "utf" not in probe.stdout.lower(), "the test needs a non-UTF-8 locale encoding to mean anything"
    done = subprocess.run([sys.executable, "-c", WRITE_UNDER_C_LOCALE, str(tmp_path)], env=env, cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ответ" in (tmp_path / "rollouts" / "step_1.jsonl").read_text(encoding="utf-8")
    assert strict_rows(tmp_path / "metrics.jsonl") == [{"step": 1, "train/Café/success": 1.0}]


def test_the_console_shows_each_validation_environment_apart(tmp_path, capsys):
    from verl.utils.tracking import Tracking

    tracker = Tracking(["console"], str(tmp_path))
    tracker.log({"val/success_rate": 0.5, "val-env/Bandit/success": 1.0, "val-env/BanditTest/success": 0.0}, step=3)
    line = capsys.readouterr().out.strip()
    assert line == "step 3: val_Bandit_success=1 val_BanditTest_success=0"
    tracker.log({"val/success_rate": 0.25, "val-env/Bandit/success": 0.25}, step=4)  # one environment: as before
    assert capsys.readouterr().out.strip() == "step 4: val_success_rate=0.25"


def test_metrics_are_reduced_by_their_name():
    from verl.utils.tracking import reduce_metrics

    reduced = reduce_metrics({"actor/pg_loss": [1.0, 3.0], "actor/rollout_logprob_diff_max": [0.5, 2.0],
                              "critic/advantages_min": [-1.0, -4.0]})
    assert reduced == {"actor/pg_loss": 2.0, "actor/rollout_logprob_diff_max": 2.0, "critic/advantages_min": -4.0}
