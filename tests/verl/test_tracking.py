"""Every logger gets every metric: JSONL, TensorBoard event files, wandb offline (no account); and the
learning-curve plots are drawn from the JSONL alone."""

import json

import pytest
from PIL import Image

from ragen.plot import plot_run
from verl.utils.tracking import Tracking

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
    assert sorted(p.name for p in paths) == ["entropy.png", "reward.png", "reward_std.png", "success.png"]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (700, 400)


def test_plotting_a_folder_without_metrics_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)
