"""End to end: `train.sh` on a tiny random model with the bundled tokenizer, through the real stack."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).parents[1]


def train(recipe: str, model_path: str, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = ["bash", str(REPO / "train.sh"), recipe, f"model_path={model_path}",
               f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={run_dir / 'hydra'}",
               "actor_rollout_ref.rollout.response_length=16", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def changed_tensors(before_dir: str, after_dir: Path) -> list[str]:
    before, after = load_file(Path(before_dir) / "model.safetensors"), load_file(after_dir / "model.safetensors")
    assert before.keys() == after.keys()
    return [k for k in before if not torch.equal(before[k], after[k])]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def ray_processes() -> list[str]:
    listing = subprocess.run(["pgrep", "-af", "raylet|gcs_server|ray::"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if "<defunct>" not in line]  # zombies are not running


def test_bandit_two_steps_on_ray(tiny_model_path, tmp_path):
    result = train("bandit", tiny_model_path, tmp_path, "trainer.total_training_steps=2")
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("rollout/reward_mean", "rollout/success_rate", "rollout/response_length", "train/Bandit/success",
                    "actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor"):
            assert key in m, key
        assert m["actor/grad_norm"] > 0
    assert "step 2:" in result.stdout
    changed = changed_tensors(tiny_model_path, tmp_path / "global_step_2" / "actor")
    assert any("layers.0.self_attn.q_proj" in k for k in changed) and any("layers.1.mlp" in k for k in changed)
    assert ray_processes() == [], "the run left Ray processes behind"


def test_sokoban_multi_turn_on_local_backend(tiny_model_path, tmp_path):
    train("sokoban", tiny_model_path, tmp_path, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2")
    (metrics,) = read_metrics(tmp_path)
    assert metrics["rollout/num_turns"] == 2  # a random model never solves it, so both turns run
    assert metrics["train/SimpleSokoban/success"] == 0.0
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")


def test_bad_config_fails_before_loading_a_model(tmp_path):
    command = ["bash", str(REPO / "train.sh"), "sokoban", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
               "model_path=/nonexistent/model", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "ppo_mini_batch_size" in result.stderr and "/nonexistent/model" not in result.stderr


def test_a_mix_of_frozen_lake_and_countdown_in_one_batch(tiny_model_path, tmp_path):
    train("frozen_lake", tiny_model_path, tmp_path, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2", "es_manager.train.env_configs.tags=[FrozenLake,Countdown]",
          "es_manager.train.env_configs.n_groups=[1,1]")
    (metrics,) = read_metrics(tmp_path)
    for tag in ("FrozenLake", "Countdown"):
        assert f"train/{tag}/success" in metrics and f"train/{tag}/valid_action_rate" in metrics
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")
