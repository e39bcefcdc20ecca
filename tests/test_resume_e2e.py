"""A real run killed with SIGKILL in the middle of a step resumes from its last checkpoint and replays
exactly what an uninterrupted run does: the same start states, replies, rewards and weights; on text, and on
pictures with a vision-language model."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.test_train_e2e import changed_tensors, read_metrics, train, train_command

ARGS = ["algo=starpo_s", "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # a critic and the filter resume too
        "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.backend=local", "agent_proxy.max_turn=2",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "actor_rollout_ref.actor.ppo_epochs=4",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.optim.lr_scheduler=cosine"]


def records(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts" / "train" / f"step_{step}.jsonl").read_text().splitlines()]


def kill_during_step(model_path: str, run_dir: Path, step: int, args: list[str] = ARGS) -> None:
    """Start a run and SIGKILL it once step `step`'s rollout is on disk, before its update is saved."""
    command = train_command("sokoban", model_path, run_dir, *args)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    marker = run_dir / "rollouts" / "train" / f"step_{step}.jsonl"
    deadline = time.monotonic() + 300
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def refused_resume(model_path: str, run_dir: Path, *overrides: str) -> str:
    """What a resume that must stop at start-up, before any model loads, prints on stderr."""
    result = subprocess.run(train_command("sokoban", model_path, run_dir, *ARGS, *overrides), capture_output=True,
                            text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0 and "cannot resume" in result.stderr, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stderr


def kill_and_resume(model_path: str, tmp_path: Path, args: list[str], steps: int) -> Path:
    """A whole run, and one killed in the middle of its last step and resumed: the last step's records, the
    metrics and every saved model must match. Returns the resumed run's folder."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    train("sokoban", model_path, whole, *args)

    kill_during_step(model_path, killed, steps, args)
    assert (killed / f"global_step_{steps - 1}" / "trainer_state.json").is_file()
    assert not (killed / f"global_step_{steps}").exists(), f"the run was not killed in the middle of step {steps}"
    result = train("sokoban", model_path, killed, *args)  # trainer.resume_mode=auto is the default
    assert "resumed from" in result.stdout and f"global_step_{steps - 1}" in result.stdout

    assert records(killed, steps) == records(whole, steps)  # same seeds, replies, actions, rewards (and pictures)
    assert [m["step"] for m in read_metrics(killed)] == list(range(1, steps + 1))
    for part in ("actor", "critic"):
        a = load_file(whole / f"global_step_{steps}" / part / "model.safetensors")
        b = load_file(killed / f"global_step_{steps}" / part / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), f"the resumed {part} differs from the uninterrupted one"
    assert (killed / "latest_checkpointed_iteration.txt").read_text() == str(steps)
    return killed


def test_a_run_killed_mid_step_resumes_and_replays_exactly(tiny_model_path, tmp_path):
    killed = kill_and_resume(tiny_model_path, tmp_path, ARGS, steps=3)

    # a resume the checkpoint cannot serve stops at start-up and says why
    assert "saved by 1 rank(s) and this run has 2" in refused_resume(
        tiny_model_path, killed, "trainer.backend=ray", "trainer.n_cpu_ranks_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    assert "lora.rank: 0 -> 4" in refused_resume(tiny_model_path, killed, "lora.rank=4")


def test_a_run_on_pictures_killed_mid_step_resumes_and_replays_exactly(tiny_model_path, tmp_path):
    """The same on pictures alone, with a tiny Idefics3-style model (made here) on the torch engine and a critic
    made of the same model: the resumed run samples from the same pictures and ends with the same weights."""
    from verl.utils.vlm import build_vlm

    vlm = build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
    args = [arg for arg in ARGS if not arg.startswith("trainer.total_training_steps")]
    killed = kill_and_resume(str(vlm), tmp_path, [*args, "trainer.total_training_steps=2",
                                                  "+custom_envs.CoordSokoban.env_config.image_observation=alone"],
                             steps=2)
    turns = [turn for record in records(killed, 2) for turn in record["turns"]]
    assert turns and all(turn["state"] == "<image>" and len(turn["images"]) == 1 for turn in turns)
    changed = changed_tensors(str(vlm), killed / "global_step_2" / "actor")  # the tower trained, so it resumed too
    assert any("vision_model" in key for key in changed) and any("text_model" in key for key in changed)
