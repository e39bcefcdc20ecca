"""`train.sh` offers the RL recipes only: not base.yaml (what they build on) nor sft.yaml (the SFT trainer's)."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).parents[1]


def train_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "train.sh"), *args], capture_output=True, text=True, timeout=120)


def test_usage_lists_the_rl_recipes_only():
    done = train_sh()
    assert done.returncode == 2 and done.stderr.startswith("usage: bash train.sh <recipe>")
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("recipes:")]
    recipes = line.removeprefix("recipes:").split()
    assert "sft" not in recipes and "base" not in recipes
    assert recipes == sorted(p.stem for p in (REPO / "config").glob("*.yaml") if p.stem not in ("base", "sft"))


def test_sft_is_refused_with_the_sft_command():
    done = train_sh("sft")
    assert done.returncode == 2 and done.stdout == ""
    assert "sft/finetune_lora.sh" in done.stderr and "not an RL recipe" in done.stderr


def test_a_common_exported_name_alone_does_not_start_the_old_form():
    """RAGEN's first train.sh read DIM_X ... from the environment; EXPERIMENT_NAME or N_GPUS alone, as many
    shells export, must still print the usage, not start a Sokoban run."""
    done = subprocess.run(["bash", str(REPO / "train.sh")], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "EXPERIMENT_NAME": "x", "N_GPUS": "1"})
    assert done.returncode == 2 and done.stderr.startswith("usage: bash train.sh <recipe>")


def test_an_unknown_recipe_is_named_with_the_nearest():
    done = subprocess.run(["bash", str(REPO / "train.sh"), "sokobon"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "unknown recipe 'sokobon' (did you mean sokoban?); the recipes: bandit countdown frozen_lake sokoban "]
