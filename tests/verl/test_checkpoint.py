"""Checkpoint bookkeeping: atomic commits, the `latest` pointer, pruning, driver RNG, train state."""

import random

import numpy as np
import pytest
import torch

from verl.utils import checkpoint


def save(root, step, keep=None):
    staging = checkpoint.staging_dir(root, step)
    (staging / "actor").mkdir()
    (staging / "actor" / "weights").write_text(f"step {step}")
    return checkpoint.commit(staging, step, {"step": step, "kl_coef": 0.1}, keep=keep)


def test_a_commit_is_atomic_and_moves_the_latest_pointer(tmp_path):
    assert checkpoint.latest_checkpoint(tmp_path) is None
    path = save(tmp_path, 2)
    assert path == tmp_path / "global_step_2" and not (tmp_path / "global_step_2.tmp").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    # a save that crashed before its commit: a staging folder that never counts
    crashed = checkpoint.staging_dir(tmp_path, 3)
    (crashed / "actor").mkdir()
    assert checkpoint.latest_checkpoint(tmp_path) == path
    assert checkpoint.read_trainer_state(path)["step"] == 2


def test_a_missing_or_stale_pointer_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    save(tmp_path, 1), save(tmp_path, 2)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")  # points at nothing
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_2"


def test_keep_prunes_the_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 2)
    (tmp_path / "global_step_2" / "actor" / "stale").write_text("from the first run")
    save(tmp_path, 2)  # a resumed run redoing step 2
    assert not (tmp_path / "global_step_2" / "actor" / "stale").exists()


def test_reading_a_checkpoint_restores_the_driver_random_streams(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = save(tmp_path, 1)
    expected = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint.read_trainer_state(path)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_an_incomplete_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.read_trainer_state(tmp_path)


def test_train_state_roundtrip_is_exact(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step(), scheduler.step()
    checkpoint.save_train_state(tmp_path / "actor", 0, optimizer, scheduler)
    expected_rng = torch.rand(1)

    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh, lambda step: 1 / (step + 1))
    checkpoint.load_train_state(tmp_path / "actor", 0, fresh, fresh_scheduler)
    assert fresh_scheduler.last_epoch == 1 and fresh.param_groups[0]["lr"] == pytest.approx(0.05)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict()["state"][0].values(),
                                                  optimizer.state_dict()["state"][0].values()))
    assert torch.rand(1) == expected_rng  # the random stream continues where it was saved
    with pytest.raises(FileNotFoundError, match="same number of ranks"):
        checkpoint.load_train_state(tmp_path / "actor", 1, fresh, fresh_scheduler)
