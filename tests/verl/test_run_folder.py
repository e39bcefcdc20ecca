"""Nothing of another run is deleted or rewritten (verl/utils/run_folder.py), damaged checkpoints are found and
passed over (verl/utils/checkpoint.py), a failed save stops with one line and leaves nothing, and a damaged batch
file is refused (verl/utils/batch_file.py). Each case is one a user hit (the issue "Nothing of yours is ever
deleted or overwritten")."""

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from tests.verl.test_checkpoint import RUN_CONFIG, Workers, ppo_trainer, save, trainer_config
from verl.protocol import DataProto
from verl.utils import checkpoint, run_folder
from verl.utils.batch_file import BatchFileError, read_batch, write_batch


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its contents: what must stay exactly as it was."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def a_run(root: Path, steps=(1, 2, 3)) -> Path:
    """A run folder as a finished run leaves it: checkpoints, metrics, records."""
    for step in steps:
        save(root, step)
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(max(steps) + 1)))
    (root / "rollouts" / "train").mkdir(parents=True)
    (root / "rollouts" / "train" / f"step_{max(steps)}.jsonl").write_text("{}\n")
    return root


# --- whose folder it is ---------------------------------------------------------------------------------------

def test_branching_from_another_folder_into_a_run_is_refused_and_touches_nothing(tmp_path):
    other, mine = a_run(tmp_path / "other", steps=(1,)), a_run(tmp_path / "mine")
    before = tree(mine)
    config = trainer_config(mine, resume_mode=str(other / "global_step_1"))
    with pytest.raises(run_folder.RunFolderError) as refused:
        run_folder.claim(config, {})
    message = str(refused.value)
    assert "\n" not in message and f"branching from {other / 'global_step_1'}" in message
    assert "checkpoints of steps 1, 2, 3; metrics.jsonl with 4 rows" in message
    assert "another trainer.experiment_name" in message and "trainer.overwrite=true" in message
    assert tree(mine) == before


def test_starting_afresh_where_a_run_lives_is_refused(tmp_path):
    mine = a_run(tmp_path / "run")
    before = tree(mine)
    with pytest.raises(run_folder.RunFolderError, match="starting afresh"):
        run_folder.claim(trainer_config(mine, resume_mode="disable"), {})
    (mine / "global_step_1" / "trainer_state.json").unlink()  # auto with no complete checkpoint left
    for step in (2, 3):
        checkpoint.remove(mine / f"global_step_{step}")
    before = tree(mine)
    with pytest.raises(run_folder.RunFolderError, match="starting afresh"):
        run_folder.claim(trainer_config(mine), {})
    assert tree(mine) == before


def test_overwrite_moves_the_old_run_aside_whole(tmp_path):
    mine = a_run(tmp_path / "run")
    before = tree(mine)
    config = trainer_config(mine, resume_mode="disable")
    config.overwrite = True
    run_folder.claim(config, {})
    asides = list(tmp_path.glob("run.old-*"))
    assert len(asides) == 1 and tree(asides[0]) == before and list(mine.iterdir()) == [mine / "run.json"]


def test_resuming_from_the_folders_own_checkpoint_goes_on_and_clears_its_crashed_saves(tmp_path, capsys):
    mine = a_run(tmp_path / "run")
    (mine / "global_step_4.tmp" / "actor").mkdir(parents=True)  # a save that crashed
    (mine / ".global_step_2.old").mkdir()
    run_folder.claim(trainer_config(mine), {})
    assert not (mine / "global_step_4.tmp").exists() and not (mine / ".global_step_2.old").exists()
    assert "removed 2 unfinished checkpoint folder(s)" in capsys.readouterr().out
    run_folder.claim(trainer_config(mine, resume_mode=str(mine / "global_step_1")), {})  # its own lineage


def test_an_empty_folder_and_hydras_own_output_folder_are_free(tmp_path):
    run_folder.claim(trainer_config(tmp_path / "new"), {})
    hydra = tmp_path / "run" / "hydra" / "2026"
    hydra.mkdir(parents=True)
    (hydra / "train.log").write_text("")
    run_folder.claim(trainer_config(tmp_path / "run", resume_mode="disable"), {"lr": 1}, own=hydra)
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(run_folder.RunFolderError):  # another run's start (other settings) is not this run's
        run_folder.claim(trainer_config(tmp_path / "run", resume_mode="disable"), {"lr": 2}, own=hydra)


def test_the_same_run_stopped_before_its_first_checkpoint_starts_again(tmp_path, capsys):
    """Ctrl-C in the first step, then the same command: the folder holds only that start (its validation,
    records, pages), which the new start replaces; once a checkpoint exists, it resumes instead."""
    run = tmp_path / "run"
    hydra = run / "hydra"
    hydra.mkdir(parents=True)
    run_folder.claim(trainer_config(run), {"lr": 1}, own=hydra)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "rollouts" / "val").mkdir(parents=True)
    run_folder.claim(trainer_config(run), {"lr": 1}, own=hydra)
    assert "this same run, stopped before its first checkpoint" in capsys.readouterr().out
    assert sorted(p.name for p in run.iterdir()) == ["hydra", "run.json"]
    (run / "global_step_1.tmp").mkdir()  # a first save that was cut short saved nothing: start again too
    run_folder.claim(trainer_config(run), {"lr": 1}, own=hydra)
    assert sorted(p.name for p in run.iterdir()) == ["hydra", "run.json"]
    (run / "global_step_1").mkdir()  # a finished checkpoint is worth keeping: starting afresh over it is refused
    with pytest.raises(run_folder.RunFolderError):
        run_folder.claim(trainer_config(run, resume_mode="disable"), {"lr": 1}, own=hydra)


@pytest.mark.parametrize("name", ["/tmp/x", "../../etc", "a/b", "..", ".hidden", "mine\ntrainer.x=1", "", "x" * 101,
                                  "with space"])
def test_a_name_that_is_a_path_is_refused(name):
    assert run_folder.check_name("trainer.experiment_name", name) is not None


@pytest.mark.parametrize("name", ["sokoban", "bandit_seed1", "lr=1e-6,bs=8", "v1.2-test", "x" * 100])
def test_names_are_accepted(name):
    assert run_folder.check_name("trainer.experiment_name", name) is None


def test_system_folders_are_refused_as_run_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for folder in ("/", "/etc", "/usr/lib", "~", ".", str(tmp_path)):
        assert run_folder.check_run_dir(folder) is not None, folder
    assert run_folder.check_run_dir("checkpoints/ragen/test") is None
    assert run_folder.check_inside("trainer.rollout_data_dir", "/tmp/elsewhere", "checkpoints/x") is not None
    assert run_folder.check_inside("logging.log_image_dir", "checkpoints/x/pages", "checkpoints/x") is None


def test_every_route_to_a_name_is_checked_before_anything_loads(tmp_path, monkeypatch):
    from ragen.config import ConfigError, validate
    from ragen.overrides import load_config
    from ragen.overrides import from_env_vars

    for override in ("trainer.experiment_name=/tmp/evil", "model.experiment_name=../../x",  # new key, old key
                     "trainer.project_name=" + "p" * 300, "trainer.default_local_dir=/",
                     "trainer.rollout_data_dir=/tmp/records", "logging.log_image_dir=log/trajectory"):
        with pytest.raises(ConfigError):
            validate(load_config("bandit", ["scale=cpu", override]), 1)
    with pytest.raises(ConfigError, match="control character"):  # the old variables: one override each
        from_env_vars({"EXPERIMENT_NAME": "mine\ntrainer.default_local_dir=X"})
    cfg = load_config("bandit", ["scale=cpu"])
    assert cfg.logging.log_image_dir == f"{cfg.trainer.default_local_dir}/pages"  # pages live in the run


def test_a_folder_that_takes_no_file_or_has_no_room_is_refused_before_a_model_loads(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(run_folder.RunFolderError, match="cannot write in"):
        run_folder.check_writable(tmp_path / "file" / "run", need_bytes=0)
    with pytest.raises(run_folder.RunFolderError, match="GiB free"):
        run_folder.check_writable(tmp_path / "run", need_bytes=2**60)
    run_folder.check_writable(tmp_path / "run", need_bytes=1)
    assert list((tmp_path / "run").iterdir()) == []  # the probe file is gone


# --- damaged checkpoints ----------------------------------------------------------------------------------------

def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "bit flipped":
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    else:
        path.unlink()


def a_run_with_weights(root: Path, steps=(1, 2)) -> Path:
    trainer = ppo_trainer(root)
    for step in steps:
        trainer.save(step)
    return root


@pytest.mark.parametrize("how", ["truncated", "bit flipped", "missing"])
@pytest.mark.parametrize("file", ["actor/weights", "config.yaml"])
def test_auto_resume_passes_over_a_damaged_newest_checkpoint(tmp_path, capsys, how, file):
    root = a_run_with_weights(tmp_path)
    damage(root / "global_step_2" / file, how)
    assert checkpoint.resume_path(trainer_config(root)) == root / "global_step_1"
    out = capsys.readouterr().out
    assert f"{root / 'global_step_2' / file}" in out and f"resuming from {root / 'global_step_1'} instead" in out
    with pytest.raises(checkpoint.ResumeError, match=f"global_step_2 is damaged.*{file}.*global_step_1"):
        checkpoint.check_resume(trainer_config(root, resume_mode=str(root / "global_step_2")), 2, RUN_CONFIG)
    resumed = ppo_trainer(root)
    assert resumed.resume() == 1


def test_a_damaged_marker_or_no_checkpoint_that_verifies_is_a_clear_error(tmp_path):
    root = a_run_with_weights(tmp_path)
    (root / "global_step_2" / "trainer_state.json").write_text("{not json")
    assert "unreadable" in checkpoint.verify(root / "global_step_2")
    damage(root / "global_step_1" / "actor" / "weights", "truncated")
    with pytest.raises(checkpoint.ResumeError, match="no earlier one with its optimizer state verifies"):
        checkpoint.resume_path(trainer_config(root))


def test_retention_keeps_a_verified_checkpoint_to_fall_back_to(tmp_path):
    trainer = ppo_trainer(tmp_path)
    trainer.config.max_actor_ckpt_to_keep, trainer.config.resumable_checkpoints = 2, 2  # the defaults
    assert trainer.config.resumable_checkpoints == type(trainer.config)().resumable_checkpoints
    trainer.save(1)
    trainer.save(2)
    damage(tmp_path / "global_step_2" / "actor" / "weights", "bit flipped")
    trainer.save(3)  # keep 2 would drop step 1, the newest that verifies before 3
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_1", "global_step_2",
                                                                      "global_step_3"]
    assert not (tmp_path / "global_step_1" / checkpoint.WEIGHTS_ONLY).exists()


def test_the_watchdogs_report_never_names_a_damaged_checkpoint(tmp_path):
    from verl.trainer.watchdog import Event, WatchdogStop

    trainer = ppo_trainer(tmp_path)
    trainer.save(1)
    trainer.save(2)
    damage(tmp_path / "global_step_2" / "actor" / "weights", "truncated")
    with pytest.raises(WatchdogStop) as stopped:
        trainer.stop([Event(step=3, attempt=0, rule="loss", action="stop", metric="loss", value=1.0, message="x")],
                     "test")
    report = Path(str(stopped.value).rpartition("report: ")[2]).read_text()
    assert "global_step_1" in report and "global_step_2" not in report


# --- a save that fails --------------------------------------------------------------------------------------------

class FullDisk(Workers):
    def save_checkpoint(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_save_on_a_full_disk_stops_with_one_line_and_leaves_nothing(tmp_path):
    trainer = ppo_trainer(tmp_path)
    trainer.save(1)
    before = tree(tmp_path)
    trainer.actor_rollout_wg = FullDisk(world_size=2)
    with pytest.raises(checkpoint.SaveError) as failed:
        trainer.save(2)
    message = str(failed.value)
    assert "\n" not in message and f"could not save checkpoint 2 in {tmp_path}: the disk is full" in message
    assert tree(tmp_path) == before  # no global_step_2.tmp, step 1 untouched


class Interrupted(Workers):
    def save_checkpoint(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text("half")
        raise KeyboardInterrupt


def test_ctrl_c_during_a_save_leaves_no_staging_folder(tmp_path):
    trainer = ppo_trainer(tmp_path)
    trainer.save(1)
    before = tree(tmp_path)
    trainer.actor_rollout_wg = Interrupted(world_size=2)
    with pytest.raises(KeyboardInterrupt):
        trainer.save(2)
    assert tree(tmp_path) == before


def test_a_cpu_run_is_resumable_from_its_last_finished_step_by_default():
    from ragen.overrides import load_config

    for recipe in ("bandit", "sokoban", "frozen_lake", "countdown"):
        assert load_config(recipe, ["scale=cpu"]).trainer.save_freq == 1, recipe


@pytest.mark.parametrize("text, cause", [("Read-only file system (os error 30)", "the file system is read-only"),
                                         ("[enforce fail at inline_container.cc:672] . unexpected pos 11904 vs 11796",
                                          "the disk is full"),
                                         ("Disk quota exceeded", "the disk quota is used up")])
def test_the_cause_of_a_failed_save_is_named(tmp_path, text, cause):
    assert f": {cause}." in str(checkpoint.save_failure(tmp_path, 3, RuntimeError(text)))


# --- damaged batch files ------------------------------------------------------------------------------------------

def a_batch(n=3, length=4) -> DataProto:
    return DataProto(batch={"input_ids": torch.arange(n * length).reshape(n, length),
                            "attention_mask": torch.ones(n, length, dtype=torch.long),
                            "loss_mask": torch.ones(n, length), "trajectory_rewards": torch.zeros(n)},
                     non_tensor_batch={"group_ids": np.arange(n)})


def rewritten_header(path: Path, change) -> None:
    """Rewrite the JSON header of a safetensors file through `change(header)`, keeping the data."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])


def dtype_to_float(header):
    header["__metadata__"]["dtypes"] = header["__metadata__"]["dtypes"].replace("torch.int64", "torch.float32")


def shape_changed(header):
    header["__metadata__"]["shapes"] = header["__metadata__"]["shapes"].replace("[3, 4]", "[3, 5]", 1)


DAMAGES = {
    "bad header size": lambda p: p.write_bytes(b"\xff" * 8 + p.read_bytes()[8:]),
    "header not json": lambda p: p.write_bytes(p.read_bytes()[:8] + b"x" + p.read_bytes()[9:]),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-20]),
    "empty": lambda p: p.write_bytes(b""),
    "wrong dtype": lambda p: rewritten_header(p, dtype_to_float),
    "wrong shape": lambda p: rewritten_header(p, shape_changed),
    "tensor missing": lambda p: rewritten_header(p, lambda h: h.pop("loss_mask")),
    "no metadata": lambda p: rewritten_header(p, lambda h: h.pop("__metadata__")),
}


@pytest.mark.parametrize("damage_name", sorted(DAMAGES))
def test_a_damaged_batch_file_is_refused_with_its_fault(tmp_path, damage_name):
    path = tmp_path / "step_1.batch.safetensors"
    write_batch(path, a_batch())
    DAMAGES[damage_name](path)
    with pytest.raises(BatchFileError, match=str(path)):
        read_batch(path)


def test_a_batch_whose_mask_lost_columns_or_rows_is_refused(tmp_path):
    batch = a_batch()
    batch.batch["attention_mask"] = batch.batch["attention_mask"][:, :-2]
    path = tmp_path / "b.safetensors"
    path.write_bytes(b"")
    write_batch(path, DataProto(batch=batch.batch, non_tensor_batch=batch.non_tensor_batch))
    with pytest.raises(BatchFileError, match="per-token tensors have different lengths"):
        read_batch(path)
    tensors = {"input_ids": torch.zeros(3, 4, dtype=torch.int32)}
    metadata = {"format": "ragen-batch/1", "dtypes": json.dumps({"input_ids": "torch.int64"}),
                "shapes": json.dumps({"input_ids": [3, 4]}), "meta_info": "{}", "info": "{}",
                "non_tensor_batch": json.dumps({"group_ids": {"dtype": "<i8", "values": [0, 1]}})}
    path.write_bytes(safetensors_bytes(tensors, metadata=metadata))
    with pytest.raises(BatchFileError, match="different numbers of trajectories"):
        read_batch(path)


def test_a_name_that_is_a_path_stops_before_hydra_makes_its_folder(tmp_path):
    import os
    import subprocess

    from tests.test_train_e2e import REPO

    result = subprocess.run(["bash", str(REPO / "train.sh"), "bandit", "trainer.experiment_name=a/../../../escaped"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0 and result.stderr.strip().startswith("config error: trainer.experiment_name=")
    assert list(tmp_path.iterdir()) == []  # no outputs/<date>/<time>-a/../../../escaped, nothing at all
