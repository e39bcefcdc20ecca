"""`python -m ragen.replay`'s parts that need no model: which checkpoint it starts from, which batches it
needs, and how it reports weights and metrics (tests/test_replay_e2e.py replays a real run)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from ragen.config import RagenConfig
from ragen.replay import ReplayError, batch_paths, compare_checkpoint, metrics_table, start_checkpoint
from ragen.replay import run_config as saved_run_config
from verl.protocol import DataProto
from verl.utils import checkpoint
from verl.utils.batch_file import batch_path, write_batch


def fake_checkpoint(run_dir, step, weights_only=False, weights=None):
    path = checkpoint.step_dir(run_dir, step)
    (path / "actor").mkdir(parents=True)
    (path / checkpoint.TRAINER_STATE).write_text(json.dumps({"step": step, "world_size": 1}))
    if weights_only:
        (path / checkpoint.WEIGHTS_ONLY).touch()
    if weights is not None:
        save_file(weights, path / "actor" / "model.safetensors")
    return path


def test_the_replay_starts_from_the_newest_checkpoint_before_the_step_with_optimizer_state(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4, weights_only=True)
    fake_checkpoint(tmp_path, 6)
    (tmp_path / "global_step_5.tmp").mkdir()  # a save cut short
    assert start_checkpoint(tmp_path, 6) == checkpoint.step_dir(tmp_path, 2)
    assert start_checkpoint(tmp_path, 7) == checkpoint.step_dir(tmp_path, 6)
    with pytest.raises(ReplayError, match="no checkpoint with optimizer state before step 2.*resumable_checkpoints"):
        start_checkpoint(tmp_path, 2)


def run_config(tmp_path, save_batches=True) -> tuple[RagenConfig, dict]:
    cfg = RagenConfig()
    cfg.trainer.rollout_data_dir, cfg.trainer.save_batches = str(tmp_path / "rollouts"), save_batches
    return cfg, {"trainer": {"save_batches": save_batches}}


def test_a_moved_run_folder_takes_its_records_along(tmp_path):
    saved = {"trainer": {"default_local_dir": "/old/run", "rollout_data_dir": "/old/run/rollouts"}}
    start = fake_checkpoint(tmp_path, 1)
    (start / checkpoint.RUN_CONFIG).write_text(json.dumps(saved))  # JSON is YAML
    cfg, _ = saved_run_config(tmp_path, start)
    assert cfg.trainer.rollout_data_dir == str(tmp_path / "rollouts")
    assert (cfg.trainer.default_local_dir, cfg.trainer.resume_mode) == (str(tmp_path), str(start))


def test_every_replayed_step_needs_its_saved_batch(tmp_path):
    cfg, saved = run_config(tmp_path)
    for step in (3, 5):
        write_batch(batch_path(tmp_path / "rollouts", step), DataProto(batch={"x": torch.zeros(1)}))
    assert batch_paths(cfg, saved, range(3, 4)) == [batch_path(tmp_path / "rollouts", 3)]
    with pytest.raises(ReplayError, match="missing batch file.*step_4.batch.safetensors"):
        batch_paths(cfg, saved, range(3, 6))


@pytest.mark.parametrize("saved", [{"trainer": {"save_batches": False}}, {"trainer": {}}])  # {}: before the key
def test_a_run_saved_without_batches_cannot_be_replayed(tmp_path, saved):
    cfg, _ = run_config(tmp_path)
    with pytest.raises(ReplayError, match="saved without batches"):
        batch_paths(cfg, saved, range(1, 2))


def test_weights_are_compared_tensor_by_tensor(tmp_path, capsys):
    weights = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
    expected = fake_checkpoint(tmp_path, 2, weights=weights)
    same = fake_checkpoint(tmp_path / "same", 2, weights=weights)
    other = fake_checkpoint(tmp_path / "other", 2, weights={"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([3.0])})
    assert compare_checkpoint(expected, same, ["actor"])
    assert "bit-identical: all 2 tensors" in capsys.readouterr().out
    assert not compare_checkpoint(expected, other, ["actor"])
    out = capsys.readouterr().out
    assert "1 of 2 tensors differ" in out and "5.000e-01" in out and "bit-identical" not in out
    assert compare_checkpoint(tmp_path / "global_step_9", other, ["actor"])  # nothing to compare with
    assert "no checkpoint" in capsys.readouterr().out


def test_the_metrics_table_puts_the_run_and_the_replay_side_by_side():
    recorded = [{"step": 2, "actor/pg_loss": 0.5, "actor/grad_norm": 1.25, "actor/entropy": 3.0}]
    table = metrics_table(recorded, {2: {"actor/pg_loss": 0.5, "actor/grad_norm": 1.5, "actor/entropy": 3.0}, 3: {}})
    rows = [line.split() for line in table.splitlines()[1:]]
    assert rows[:2] == [["2", "actor/grad_norm", "1.25", "1.5", "differs"],
                        ["2", "actor/pg_loss", "0.5", "0.5", "same"]]
    assert "no update" in table.splitlines()[3]  # step 3: the filter kept nothing


def test_a_damaged_batch_file_ends_the_replay_with_exit_2_and_one_line(tmp_path, monkeypatch, capsys):
    import sys

    from ragen.replay import main

    saved = {"trainer": {"default_local_dir": str(tmp_path), "rollout_data_dir": str(tmp_path / "rollouts"),
                         "save_batches": True}}
    start = fake_checkpoint(tmp_path, 1)
    (start / checkpoint.RUN_CONFIG).write_text(json.dumps(saved))
    path = batch_path(tmp_path / "rollouts", 2)
    write_batch(path, DataProto(batch={"input_ids": torch.zeros(2, 3, dtype=torch.long)}))
    path.write_bytes(path.read_bytes()[:-5])  # cut short
    monkeypatch.setattr(sys, "argv", ["ragen.replay", str(tmp_path), "--step", "2"])
    with pytest.raises(SystemExit) as ended:
        main()
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"cannot replay: {path} is damaged") and "cannot be replayed" in err
