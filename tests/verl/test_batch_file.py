"""A training step's batch saved as safetensors and read back exactly (verl/utils/batch_file.py), and the
trainer saving the batch that its update gets."""

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.verl.test_ppo_trainer import make_trainer
from verl.protocol import DataProto
from verl.trainer.config import RolloutConfig
from verl.utils.batch_file import batch_path, read_batch, write_batch


def a_batch(n: int = 3) -> DataProto:
    return DataProto(batch={"input_ids": torch.tensor([[49152, 7, 0]] * n), "loss_mask": torch.ones(n, 3),
                            "attention_mask": torch.ones(n, 3, dtype=torch.long),
                            "turn_ids": torch.full((n, 3), -1), "flags": torch.ones(n, dtype=torch.bool),
                            "rewards": torch.tensor([0.1, -2.5, float("nan")])[:n]},
                     non_tensor_batch={"group_ids": np.arange(n), "env_failed": np.array([False, True, False])[:n],
                                       "tags": np.array(["Bandit", "Sokoban", "Bandit"], dtype=object)[:n]})


def assert_same(got: DataProto, want: DataProto) -> None:
    assert got.batch.keys() == want.batch.keys() and got.non_tensor_batch.keys() == want.non_tensor_batch.keys()
    for key, tensor in want.batch.items():
        assert got.batch[key].dtype == tensor.dtype and torch.equal(got.batch[key].nan_to_num(), tensor.nan_to_num())
    for key, values in want.non_tensor_batch.items():
        assert got.non_tensor_batch[key].dtype == values.dtype and got.non_tensor_batch[key].tolist() == values.tolist()


def test_a_batch_reads_back_exactly_with_its_dtypes_and_info(tmp_path):
    batch = a_batch()
    batch.meta_info = {"note": "kept"}
    write_batch(tmp_path / "b.safetensors", batch, step=3, torch_threads=2)
    got, info = read_batch(tmp_path / "b.safetensors")
    assert_same(got, batch)
    assert got.meta_info == {"note": "kept"} and info == {"step": 3, "torch_threads": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["b.safetensors"]  # the staging file was renamed


def test_integer_tensors_are_stored_in_the_narrowest_type(tmp_path):
    write_batch(tmp_path / "b.safetensors", a_batch())
    with safe_open(tmp_path / "b.safetensors", framework="pt") as f:
        stored = {key: f.get_tensor(key).dtype for key in f.keys()}
    assert stored["input_ids"] == torch.int32 and stored["attention_mask"] == stored["turn_ids"] == torch.int8
    assert stored["loss_mask"] == torch.float32 and stored["flags"] == torch.bool


def test_an_empty_batch_reads_back_empty(tmp_path):
    batch = a_batch()[np.zeros(3, dtype=bool)]
    write_batch(tmp_path / "b.safetensors", batch)
    got, _ = read_batch(tmp_path / "b.safetensors")
    assert len(got) == 0 and got.batch["input_ids"].shape == (0, 3)
    assert_same(got, batch)


def test_another_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="not a batch file"):
        read_batch(tmp_path / "model.safetensors")


def test_the_trainer_saves_the_filtered_batch_its_update_gets(tmp_path):
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], steps=2,
                              rollout=RolloutConfig(rollout_filter_value=0.3))
    trainer.config.rollout_data_dir = str(tmp_path / "rollouts")
    updated, train_on = [], trainer.train_on
    trainer.train_on = lambda batch, step, metrics: train_on(updated.append(batch) or batch, step, metrics)
    trainer.fit()
    assert [len(batch) for batch in updated] == [2, 2]  # the group whose rewards differ, of 3 groups
    for step, batch in enumerate(updated, start=1):
        got, info = read_batch(batch_path(tmp_path / "rollouts", step))
        assert info["step"] == step and info["torch_threads"] == torch.get_num_threads()
        assert_same(got, batch)

    trainer.config.save_batches = False
    (tmp_path / "rollouts" / "train" / "step_1.batch.safetensors").unlink()
    trainer.config.resume_mode = "disable"
    trainer.fit()
    assert not batch_path(tmp_path / "rollouts", 1).exists()
