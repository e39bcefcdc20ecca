"""An environment served from a virtualenv of its own: `scripts/make_env_venv.sh gym_sokoban` builds one (without
torch), `python -m ragen.envs.serve gym_sokoban` in it plays exactly as the env in this process, and RAGEN trains
on it through a spawned server (custom_envs.<tag>.server.python).

Builds the venv with pip once for the module (~20 s with a reachable index); skipped only where pip reaches no
package index. The comparison needs gym-sokoban here too (the `test` extra).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ragen.config import EnvServerConfig
from ragen.envs import make_env, remote
from ragen.envs.sokoban import ACTIONS
from ragen.overrides import load_config
from tests.test_train_e2e import read_metrics, train

pytest.importorskip("gym_sokoban", reason="needs the test extra: gym-sokoban and setuptools<81")

REPO = Path(__file__).parents[3]
TAG = "GymSokoban"  # config/base.yaml's gym_sokoban tag


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """The interpreter of a venv built by `make_env_venv.sh gym_sokoban`."""
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--timeout", "20", "--retries", "1",
                            "--dest", str(tmp_path_factory.mktemp("probe")), "gym-sokoban==0.0.6"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip("pip cannot reach a package index: " + probe.stderr.strip()[-300:])
    venv = tmp_path_factory.mktemp("env_venv") / ".venv-gym-sokoban"
    result = subprocess.run(["bash", str(REPO / "scripts" / "make_env_venv.sh"), "gym_sokoban", str(venv)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    python = venv / "bin" / "python"
    assert result.stdout.splitlines()[-1] == \
        f"  custom_envs.{TAG}.server.spawn=true custom_envs.{TAG}.server.python={python}"
    return python


def play(env, seed: int) -> list:
    """reset(seed), then 12 moves drawn from the seed (fewer if the episode ends): everything the env returned."""
    words = list(ACTIONS)
    transcript = [env.reset(seed=seed)]
    for i in np.random.default_rng([seed, 5]).integers(len(words), size=12):
        transcript.append(env.step(words[i]))
        if transcript[-1][2] or transcript[-1][3]:
            break
    return transcript


def test_the_venv_has_no_torch_and_its_server_plays_as_in_process(venv_python):
    found = subprocess.run([str(venv_python), "-c", "import importlib.util as u; "
                            "print([m for m in ('torch', 'transformers', 'ray', 'hydra') if u.find_spec(m)])"],
                           capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr

    env_config = dict(load_config().custom_envs[TAG].env_config)
    server = subprocess.Popen([str(venv_python), "-m", "ragen.envs.serve", "gym_sokoban", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = server.stdout.readline()
        assert line.startswith("[ragen.envs.serve] listening on http://127.0.0.1:"), line + server.stdout.read()
        url = line.split()[-1]

        def served(seed: int) -> list:
            return play(remote.make_remote_env(EnvServerConfig(url=url), "gym_sokoban", env_config), seed)

        seeds = range(16)
        with ThreadPoolExecutor(8) as pool:  # sessions generating levels at once in the one server process
            over_http = list(pool.map(served, seeds))
        assert over_http == [play(make_env("gym_sokoban", env_config), seed) for seed in seeds]
    finally:
        remote.stop_servers()  # closes the clients
        server.terminate()
        server.wait(timeout=30)


def test_ragen_trains_two_steps_on_the_spawned_server(venv_python, tiny_model_path, tmp_path):
    train("sokoban", tiny_model_path, tmp_path, "trainer.total_training_steps=2", "trainer.backend=local",
          "agent_proxy.max_turn=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
          f"es_manager.train.env_configs.tags=[{TAG}]", f"custom_envs.{TAG}.server.spawn=true",
          f"custom_envs.{TAG}.server.python={venv_python}")
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/pg_loss" in m and m["actor/grad_norm"] > 0 and f"train/{TAG}/success" in m for m in metrics)
    assert all(m["rollout/env_failures"] == 0 for m in metrics)

    env = make_env("gym_sokoban", dict(load_config().custom_envs[TAG].env_config))
    for step in (1, 2):
        lines = (tmp_path / "rollouts" / "train" / f"step_{step}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) == 4 * 4 and all(r["tag"] == TAG and r["env_error"] is None for r in records)
        # each trajectory started from the gym-sokoban level of its seed
        assert all(r["turns"][0]["state"] == env.reset(seed=r["seed"])[0] for r in records)


def test_the_script_prints_its_usage_and_refuses_an_env_type_it_does_not_know(tmp_path):
    script = str(REPO / "scripts" / "make_env_venv.sh")
    usage = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and "bash scripts/make_env_venv.sh gym_sokoban .venv-gym-sokoban" in usage.stdout
    unknown = subprocess.run(["bash", script, "chess", str(tmp_path / "venv")], capture_output=True, text=True,
                             timeout=60)
    assert unknown.returncode == 2 and "unknown env type 'chess'" in unknown.stderr
    assert not (tmp_path / "venv").exists()
