"""End to end: a run's saved batch fed back through its step's update (`python -m ragen.replay`) gives that
step's checkpoint bit for bit; a tampered batch does not."""

import os
import subprocess
from pathlib import Path

from tests.test_train_e2e import train
from verl.utils.batch_file import batch_path, read_batch, write_batch

REPO = Path(__file__).parents[1]


def replay(run_dir: Path, step: int) -> subprocess.CompletedProcess:
    return subprocess.run(["python", "-m", "ragen.replay", str(run_dir), "--step", str(step)], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_replayed_step_gives_its_checkpoint_bit_for_bit_and_a_tampered_batch_does_not(tiny_model_path, tmp_path):
    train("bandit", tiny_model_path, tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=1",
          "trainer.resumable_checkpoints=null", "trainer.backend=local", "trainer.val_before_train=false",
          "trainer.test_freq=-1", "logging.log_images=false", "es_manager.train.env_groups=4",
          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")

    result = replay(tmp_path, step=2)  # from global_step_1, compared with global_step_2
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "replaying steps 2..2" in result.stdout and f"from {tmp_path / 'global_step_1'}" in result.stdout
    assert "actor vs" in result.stdout and "bit-identical: all 20 tensors" in result.stdout  # the tiny Llama's
    losses = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("2  actor/")]
    assert {row[1] for row in losses} >= {"actor/pg_loss", "actor/grad_norm"}
    assert all(row[-1] == "same" for row in losses), result.stdout  # metrics.jsonl's, to the last digit

    path = batch_path(tmp_path / "rollouts", 2)
    batch, info = read_batch(path)
    rewards, loss_mask = batch.batch["token_rewards"], batch.batch["loss_mask"]
    rewards[0] += loss_mask[0]  # the first trajectory's reward raised: now it beat the rest of its group
    write_batch(path, batch, **info)
    result = replay(tmp_path, step=2)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tensors differ (max |diff|)" in result.stdout and "bit-identical" not in result.stdout
    assert any(line.endswith("differs") for line in result.stdout.splitlines())
