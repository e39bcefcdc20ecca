"""Checkpoint bookkeeping: atomic commits and replacement, the `latest` pointer, pruning, driver RNG, train
state, and the resume checks (ranks, changed settings)."""

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from verl.trainer.config import TrainerConfig
from verl.utils import checkpoint

RUN_CONFIG = {"model_path": "tiny", "trainer": {"total_training_steps": 100},
              "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6, "betas": [0.9, 0.999]}}}}


def save(root, step, keep=None, run_config=RUN_CONFIG, world_size=1):
    staging = checkpoint.staging_dir(root, step)
    (staging / "actor").mkdir()
    (staging / "actor" / "weights").write_text(f"step {step}")
    state = {"step": step, "world_size": world_size, "kl_coef": 0.1}
    return checkpoint.commit(staging, step, state, run_config, keep=keep)


def steps_on_disk(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != "latest_checkpointed_iteration.txt")


def is_complete(path: Path) -> bool:
    return (path / "trainer_state.json").is_file() and (path / "actor" / "weights").is_file()


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
    assert yaml.safe_load((path / "config.yaml").read_text()) == RUN_CONFIG


def test_a_missing_or_stale_pointer_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    save(tmp_path, 1), save(tmp_path, 2)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")  # points at nothing
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_2"


def test_keep_prunes_the_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    assert steps_on_disk(tmp_path) == ["global_step_3", "global_step_4"]


@pytest.mark.parametrize("keep, survivors", [(1, ["global_step_30"]), (2, ["global_step_20", "global_step_30"]),
                                             (None, ["global_step_20", "global_step_30", "global_step_40"])])
def test_a_run_resumed_from_an_earlier_step_keeps_what_it_writes(tmp_path, keep, survivors):
    save(tmp_path, 20), save(tmp_path, 40)
    save(tmp_path, 30, keep=keep)  # a run resumed from global_step_20 while global_step_40 exists
    assert steps_on_disk(tmp_path) == survivors  # with a limit, the abandoned 40 goes first, never 30
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_30"  # the pointer, not the highest


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 2)
    (tmp_path / "global_step_2" / "actor" / "stale").write_text("from the first run")
    save(tmp_path, 2)  # a resumed run redoing step 2
    assert not (tmp_path / "global_step_2" / "actor" / "stale").exists()
    assert steps_on_disk(tmp_path) == ["global_step_2"]  # nothing left aside


class Killed(BaseException):
    """The process dies here (SIGKILL): nothing after it runs, no `finally` cleans up."""


def killed_mid_delete(monkeypatch, weights_file="actor/weights"):
    """Deleting a folder with weights dies after removing the weights, the rest of it still there."""
    real_rmtree = checkpoint.shutil.rmtree

    def rmtree(path, ignore_errors=False):
        weights = Path(path) / weights_file
        if weights.exists():
            weights.unlink()
            raise Killed
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)


def killed_between_renames(monkeypatch):
    real_replace = os.replace

    def replace(src, dst):
        if Path(src).name.endswith(".tmp") and Path(dst).name.startswith("global_step_"):
            raise Killed  # the old folder may be gone already, the new one not yet in place
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)


def killed_before_the_pointer(monkeypatch):
    def write_atomic(path, text):
        raise Killed

    monkeypatch.setattr(checkpoint, "_write_atomic", write_atomic)


@pytest.mark.parametrize("crash", [killed_mid_delete, killed_between_renames, killed_before_the_pointer])
def test_a_crash_while_saving_a_step_again_leaves_a_complete_latest_checkpoint(tmp_path, monkeypatch, crash):
    save(tmp_path, 20), save(tmp_path, 40)
    staging = checkpoint.staging_dir(tmp_path, 40)  # a run resumed from step 20 saves step 40 again
    (staging / "actor").mkdir()
    (staging / "actor" / "weights").write_text("step 40, second time")
    with monkeypatch.context() as patched:
        crash(patched)
        with pytest.raises(Killed):
            checkpoint.commit(staging, 40, {"step": 40, "world_size": 1, "kl_coef": 0.1}, RUN_CONFIG, keep=None)
    latest = checkpoint.latest_checkpoint(tmp_path)
    assert latest in (tmp_path / "global_step_20", tmp_path / "global_step_40") and is_complete(latest)
    # the next save of the step cleans up whatever the crash left
    save(tmp_path, 40)
    assert steps_on_disk(tmp_path) == ["global_step_20", "global_step_40"]
    assert is_complete(checkpoint.latest_checkpoint(tmp_path))


def test_a_half_deleted_checkpoint_never_counts(tmp_path, monkeypatch):
    save(tmp_path, 20), save(tmp_path, 40)
    killed_mid_delete(monkeypatch)
    with pytest.raises(Killed):
        checkpoint.remove(tmp_path / "global_step_40")  # pruning, killed
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_20"


def test_everything_is_on_disk_before_the_rename_makes_it_visible(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(checkpoint, "_fsync", lambda path: events.append(("fsync", Path(path).name)))
    real_replace = os.replace
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda src, dst: (events.append(("replace", Path(dst).name)), real_replace(src, dst)))
    save(tmp_path, 3)
    rename = events.index(("replace", "global_step_3"))
    flushed = {name for what, name in events[:rename] if what == "fsync"}
    assert {"weights", "actor", "trainer_state.json", "config.yaml", "global_step_3.tmp"} <= flushed
    assert ("fsync", tmp_path.name) in events[rename:]  # the rename itself
    pointer = events.index(("replace", "latest_checkpointed_iteration.txt"))
    assert ("fsync", "latest_checkpointed_iteration.txt.tmp") in events[rename:pointer]


def test_written_whole_never_leaves_half_a_folder(tmp_path, monkeypatch):
    def write(text):
        with checkpoint.written_whole(tmp_path / "merged") as folder:
            (folder / "model").write_text(text), (folder / "config").write_text(text)

    write("old")
    with monkeypatch.context() as patched:
        killed_mid_delete(patched, weights_file="model")
        with pytest.raises(Killed):
            write("new")
    assert (tmp_path / "merged" / "model").read_text() == (tmp_path / "merged" / "config").read_text() == "new"
    write("newer")  # cleans up what the crash left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_reading_a_checkpoint_restores_the_driver_random_streams(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = save(tmp_path, 1)
    expected = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint.set_driver_rng_state(checkpoint.read_trainer_state(path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_an_older_checkpoint_reads_with_the_later_fields_at_their_defaults(tmp_path):
    (tmp_path / checkpoint.TRAINER_STATE).write_text('{"step": 4, "world_size": 1, "rollbacks": 2}')
    state = checkpoint.read_trainer_state(tmp_path)
    assert state == {"step": 4, "world_size": 1, "rollbacks": 2, "healthy": True, "watchdog_streaks": {},
                     "empty_filter_steps": 0, "empty_filter_streak": 0}  # what it recorded is kept


def test_an_incomplete_folder_is_refused(tmp_path):
    with pytest.raises(checkpoint.ResumeError, match="not a complete checkpoint"):
        checkpoint.read_trainer_state(tmp_path)


def make_optimizer(model, lr, betas=(0.9, 0.999), weight_decay=0.0):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))


def test_train_state_roundtrip_is_exact(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer, scheduler = make_optimizer(model, lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step(), scheduler.step()
    checkpoint.save_train_state(tmp_path / "actor", 0, optimizer, scheduler)
    expected_rng = torch.rand(1)

    fresh, fresh_scheduler = make_optimizer(model, lr=0.1)
    checkpoint.load_train_state(tmp_path / "actor", 0, fresh, fresh_scheduler)
    assert fresh_scheduler.last_epoch == 1 and fresh.param_groups[0]["lr"] == pytest.approx(0.05)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict()["state"][0].values(),
                                                  optimizer.state_dict()["state"][0].values()))
    assert fresh.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]  # bit for bit
    assert torch.rand(1) == expected_rng  # the random stream continues where it was saved
    with pytest.raises(FileNotFoundError, match="same number of ranks"):
        checkpoint.load_train_state(tmp_path / "actor", 1, fresh, fresh_scheduler)


def test_a_resumed_optimizer_takes_the_new_config_and_keeps_the_saved_state(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer, scheduler = make_optimizer(model, lr=0.1)
    for _ in range(2):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step(), scheduler.step()
    checkpoint.save_train_state(tmp_path, 0, optimizer, scheduler)

    resumed, resumed_scheduler = make_optimizer(model, lr=0.01, betas=(0.5, 0.9), weight_decay=0.2)
    checkpoint.load_train_state(tmp_path, 0, resumed, resumed_scheduler)
    group = resumed.param_groups[0]
    assert group["lr"] == pytest.approx(0.01 / 3)  # the new lr at the saved position of the schedule
    assert (group["betas"], group["weight_decay"], group["initial_lr"]) == ((0.5, 0.9), 0.2, 0.01)
    assert resumed_scheduler.get_last_lr() == [group["lr"]]
    assert torch.equal(resumed.state[model.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    resumed_scheduler.step()
    assert group["lr"] == pytest.approx(0.01 / 4)  # the schedule goes on from the new base lr


class Evil:
    def __reduce__(self):
        return os.mkdir, (str(Path(os.environ["EVIL_DIR"]) / "pwned"),)


def test_a_train_state_file_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.setenv("EVIL_DIR", str(tmp_path))
    model = torch.nn.Linear(3, 2)
    torch.save({"optimizer": Evil()}, tmp_path / "train_state_rank0.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        checkpoint.load_train_state(tmp_path, 0, *make_optimizer(model, lr=0.1))
    assert not (tmp_path / "pwned").exists()


def test_a_sharded_optimizer_state_loads_with_weights_only(tmp_path):
    from torch.distributed.fsdp import fully_shard

    from verl.utils.fsdp import init_single_rank_group

    init_single_rank_group("gloo")  # what a one-rank worker joins
    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(3, 2)))
    optimizer, scheduler = make_optimizer(model, lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step(), scheduler.step()
    checkpoint.save_train_state(tmp_path, 0, optimizer, scheduler)
    fresh, fresh_scheduler = make_optimizer(model, lr=0.1)
    checkpoint.load_train_state(tmp_path, 0, fresh, fresh_scheduler)
    moments = fresh.state[next(model.parameters())]["exp_avg"]
    assert type(moments).__name__ == "DTensor"
    assert torch.equal(moments.full_tensor(), optimizer.state[next(model.parameters())]["exp_avg"].full_tensor())


def trainer_config(root, **overrides) -> TrainerConfig:
    return TrainerConfig(default_local_dir=str(root), **overrides)


def test_resuming_with_another_number_of_ranks_is_refused_naming_both(tmp_path):
    save(tmp_path, 5, world_size=2)
    with pytest.raises(checkpoint.ResumeError, match=r"saved by 2 rank\(s\) and this run has 1"):
        checkpoint.check_resume(trainer_config(tmp_path), 1, RUN_CONFIG)
    assert checkpoint.check_resume(trainer_config(tmp_path), 2, RUN_CONFIG) == {}
    assert checkpoint.check_resume(trainer_config(tmp_path, resume_mode="disable"), 1, RUN_CONFIG) == {}


def test_a_checkpoint_of_an_earlier_ragen_is_refused_with_what_to_do(tmp_path):
    path = save(tmp_path, 5)
    (path / "config.yaml").unlink()  # written before checkpoints held their config and rank count
    (path / "manifest.json").unlink()  # and their manifest
    with pytest.raises(checkpoint.ResumeError, match="earlier RAGEN.*another trainer.experiment_name"):
        checkpoint.check_resume(trainer_config(tmp_path), 1, RUN_CONFIG)


def test_changed_settings_are_reported_and_fixed_ones_refused(tmp_path, capsys):
    save(tmp_path, 5)
    new = {**RUN_CONFIG, "trainer": {"total_training_steps": 200},
           "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-5, "betas": [0.9, 0.999]}}}}
    changes = checkpoint.check_resume(trainer_config(tmp_path), 1, new)
    assert changes == {"actor_rollout_ref.actor.optim.lr": (1e-6, 1e-5), "trainer.total_training_steps": (100, 200)}
    assert "actor_rollout_ref.actor.optim.lr: 1e-06 -> 1e-05" in capsys.readouterr().out

    other_model = {**new, "model_path": "other", "lora": {"rank": 8}}
    with pytest.raises(checkpoint.ResumeError, match="model_path: 'tiny' -> 'other'") as refused:
        checkpoint.check_resume(trainer_config(tmp_path), 1, other_model)
    assert "lora.rank: '<absent>' -> 8" in str(refused.value) and "optim.lr" not in str(refused.value)
    assert "trainer.resume_force=true" in str(refused.value)
    forced = checkpoint.check_resume(trainer_config(tmp_path, resume_force=True), 1, other_model)
    assert forced["model_path"] == ("tiny", "other")


def test_config_changes_compares_leaves_by_dotted_key():
    old = {"a": {"b": 1, "c": [1, 2]}, "d": {}, "e": "x"}
    new = {"a": {"b": 1, "c": [1, 3]}, "d": {"f": 2}}
    assert checkpoint.config_changes(old, new) == {"a.c": ([1, 2], [1, 3]), "d": ({}, "<absent>"),
                                                   "d.f": ("<absent>", 2), "e": ("x", "<absent>")}


class Workers:
    """A worker group that writes and reads a marker file as its checkpoint."""

    def __init__(self, world_size=1):
        self.world_size, self.loaded = world_size, None

    def save_checkpoint(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text("w")

    def load_checkpoint(self, path):
        self.loaded = path


class Tracker:
    def truncate(self, after_step, set_aside_as=None):
        self.after_step = after_step


def ppo_trainer(root, kl_coef=0.1, kl_type="adaptive", run_config=RUN_CONFIG, resume_mode="auto"):
    from verl.trainer.config import AlgorithmConfig, KLControlConfig, RolloutConfig
    from verl.trainer.ppo_trainer import PPOTrainer

    algorithm = AlgorithmConfig(kl_ctrl=KLControlConfig(type=kl_type, kl_coef=kl_coef))
    return PPOTrainer(trainer_config(root, resume_mode=resume_mode), algorithm, RolloutConfig(), Workers(world_size=2),
                      None, agent=None, tracker=Tracker(), run_config=run_config)


def test_the_trainer_saves_its_ranks_and_config_and_resumes_the_kl_controller(tmp_path):
    trainer = ppo_trainer(tmp_path, run_config=RUN_CONFIG)
    trainer.kl_ctrl.value = 0.25  # the adaptive controller moved
    trainer.save(3)
    assert checkpoint.read_trainer_state(tmp_path / "global_step_3")["world_size"] == 2
    assert yaml.safe_load((tmp_path / "global_step_3" / "config.yaml").read_text()) == RUN_CONFIG

    resumed = ppo_trainer(tmp_path)
    assert resumed.resume() == 3 and resumed.actor_rollout_wg.loaded == str(tmp_path / "global_step_3" / "actor")
    assert resumed.kl_ctrl.value == 0.25 and resumed.tracker.after_step == 3
    restarted = ppo_trainer(tmp_path, kl_coef=0.5)  # a new algorithm.kl_ctrl.kl_coef is not silently ignored
    assert restarted.resume() == 3 and restarted.kl_ctrl.value == 0.5
    fixed = ppo_trainer(tmp_path, kl_type="fixed")  # so is a new controller type with the same coefficient
    assert fixed.resume() == 3 and fixed.kl_ctrl.value == 0.1
    assert ppo_trainer(tmp_path, resume_mode="disable").resume() == 0


def test_older_checkpoints_keep_their_weights_and_drop_their_optimizer_state(tmp_path):
    def save_with_train_state(step, resumable):
        staging = checkpoint.staging_dir(tmp_path, step)
        (staging / "actor").mkdir()
        (staging / "actor" / "weights").write_text(f"step {step}")
        (staging / "actor" / "train_state_rank0.pt").write_text("moments")
        checkpoint.commit(staging, step, {"step": step, "world_size": 1}, RUN_CONFIG, keep=3, resumable=resumable)

    for step in (1, 2, 3):
        save_with_train_state(step, resumable=2)
    has_state = [(tmp_path / f"global_step_{s}" / "actor" / "train_state_rank0.pt").exists() for s in (1, 2, 3)]
    assert has_state == [False, True, True]
    assert all((tmp_path / f"global_step_{s}" / "actor" / "weights").exists() for s in (1, 2, 3))
    with pytest.raises(checkpoint.ResumeError, match="keeps only its weights.*model_path="):
        checkpoint.check_resume(trainer_config(tmp_path, resume_mode=str(tmp_path / "global_step_1")), 1, RUN_CONFIG)
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    (tmp_path / "global_step_3" / "trainer_state.json").unlink()  # the newest is broken: fall back to one that resumes
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    save_with_train_state(4, resumable=None)  # null: nothing more is dropped
    assert (tmp_path / "global_step_2" / "actor" / "train_state_rank0.pt").exists()
