"""RAGEN's own commands, from its READMEs (/work/shared/seeds), run through `train.sh` on the tiny model.

Each trains one step, so the old names must reach the settings they name; docs/old-ragen.md, "Old RAGEN commands
and keys" lists the translation.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.test_train_e2e import REPO, changed_tensors, train

# algo=rloo: the sokoban recipe's filter (gigpo's) keeps no group of a random model, whose rewards never differ
FAST = ["trainer.total_training_steps=1", "trainer.backend=local", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "algo=rloo"]


def hydra_config(run_dir: Path) -> dict:
    """The config the run composed, as Hydra saved it."""
    return yaml.safe_load((run_dir / "hydra" / ".hydra" / "config.yaml").read_text())


def test_the_readme_command_with_old_keys_trains(tiny_model_path, tmp_path):
    # README: bash train.sh sokoban model.experiment_name=new_test_debug training.train_batch_size=128
    # training.ppo_batch_size=64; the sizes cut to one CPU-sized step (test_config checks 128 and 64)
    result = train("sokoban", tiny_model_path, tmp_path, "model.experiment_name=new_test_debug",
                   "training.train_batch_size=2", "training.n_rollout=2", "training.ppo_batch_size=4", *FAST)
    assert "model.experiment_name=new_test_debug: RAGEN's old key, now trainer.experiment_name=new_test_debug" \
        in result.stderr
    cfg = hydra_config(tmp_path)
    assert cfg["trainer"]["experiment_name"] == "new_test_debug"
    assert (cfg["es_manager"]["train"]["env_groups"], cfg["es_manager"]["train"]["group_size"]) == (2, 2)
    assert cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 4
    assert len((tmp_path / "rollouts" / "train" / "step_1.jsonl").read_text().splitlines()) == 2 * 2
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")


def test_a_key_nothing_reads_stops_the_run_before_any_model_loads(tmp_path):
    result = subprocess.run(["bash", str(REPO / "train.sh"), "sokoban", "+model.experimnt_name=x",
                             f"trainer.default_local_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "config error: model.experimnt_name is not a config key" in result.stderr
    assert "did you mean trainer.experiment_name?" in result.stderr and not any(tmp_path.iterdir())


def test_the_first_readme_environment_variables_train(tiny_model_path, tmp_path):
    from ragen.utils.wandb import download_wandb

    # the first README's exports, cut to one CPU-sized step; `bash ./train.sh` names no recipe
    readme = {"DATA_DIR": "data/sokoban", "DIM_X": "6", "DIM_Y": "6", "NUM_BOXES": "1", "MAX_STEPS": "5",
              "SEARCH_DEPTH": "30", "BASE_MODEL": tiny_model_path, "EXPERIMENT_NAME": "test-tiny",
              "MICRO_BATCH_SIZE": "2", "TRAIN_BATCH_SIZE": "2", "PPO_BATCH_SIZE": "8", "MAX_START_LENGTH": "400", "MAX_RESPONSE_LENGTH": "16",
              "MAX_OBS_LENGTH": "120", "MAX_TURNS": "2", "NUM_UPDATE_PER_ROLL": "1", "LOG_MODE": "['wandb']",
              "GCP": "True", "N_GPUS": "1", "ROLLOUT_TP_SIZE": "1"}
    command = ["bash", str(REPO / "train.sh"), f"trainer.default_local_dir={tmp_path}",
               f"hydra.run.dir={tmp_path / 'hydra'}", f"logging.log_image_dir={tmp_path / 'log'}",
               "algorithm.skip_zero_variance_batches=false", *FAST]
    # started from another folder than the run folder: a run may not own the folder it is started from
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tempfile.mkdtemp(),
                            env={**os.environ, **readme, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "DIM_X=6: RAGEN's old variable, now ++custom_envs.CoordSokoban.env_config.dim_x=6" in result.stderr
    assert "MAX_START_LENGTH=400 ignored" in result.stderr and "(nearest: actor_rollout_ref.rollout.max_model_len)" \
        in result.stderr
    cfg = hydra_config(tmp_path)
    assert cfg["custom_envs"]["CoordSokoban"]["env_config"] == {  # the sokoban recipe's tag
        "dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 5, "search_depth": 30, "cell_separator": " ",
        "observation_format": "grid_coord", "neighbours": False, "columns": False}
    assert (cfg["model_path"], cfg["trainer"]["experiment_name"], cfg["trainer"]["logger"]) == (
        tiny_model_path, "test-tiny", ["wandb"])
    assert (cfg["agent_proxy"]["max_turn"], cfg["actor_rollout_ref"]["rollout"]["response_length"]) == (2, 16)
    assert cfg["actor_rollout_ref"]["model"]["enable_gradient_checkpointing"] is True
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")
    # the run logged to wandb only (LOG_MODE), offline: RAGEN's download_wandb reads it back from its folder
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    metrics = download_wandb(run.name.rpartition("-")[2], tmp_path / "export", roots=[tmp_path]) / "metrics.jsonl"
    (row,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert row["step"] == 1 and "actor/pg_loss" in row and row["rollout/num_turns"] == 2


def run_script(*command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=300, cwd=cwd,
                            env={**os.environ, **env, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_download_data_builds_the_data_locally(tmp_path):
    result = run_script(sys.executable, str(REPO / "scripts" / "download_data.py"), "--train-size", "3",
                        "--test-size", "1", "--output", str(tmp_path), cwd=tmp_path)
    assert "downloads nothing" in result.stdout
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet")) == [
        f"{tag}/{split}.parquet" for tag in ("Bandit", "Countdown", "FrozenLake", "SimpleSokoban")
        for split in ("test", "train")]


def test_dataset_curation_makes_the_room_its_variables_describe(tmp_path):
    # the first README: DIM_X=6 ... python scripts/dataset_curation.py --output data/sokoban --seed 10000 ...
    run_script(sys.executable, str(REPO / "scripts" / "dataset_curation.py"), "--output", "data/sokoban", "--seed",
               "10000", "--train_size", "4", "--test_size", "2", "--prefix", "qwen-instruct", cwd=tmp_path,
               DIM_X="7", DIM_Y="6", NUM_BOXES="1", MAX_STEPS="5", SEARCH_DEPTH="30")
    train_rows = pq.read_table(tmp_path / "data" / "sokoban" / "SimpleSokoban" / "train.parquet").to_pylist()
    assert [row["seed"] for row in train_rows] == [10000, 10001, 10002, 10003]
    assert json.loads(train_rows[0]["env_config"]) == {"dim_x": 7, "dim_y": 6, "num_boxes": 1, "max_steps": 5,
                                                        "search_depth": 30, "cell_separator": ""}
    assert len(train_rows[0]["observation"].splitlines()[0]) == 7  # a row of the 7-wide room


def test_setup_ragen_runs_the_readme_install(tmp_path):
    """The script's commands are the README's; run for real in a copy of the repository, it makes a venv in which
    RAGEN imports from that copy and the bundled model resolves. The copy's venv sees this venv's packages (a
    .pth file), so nothing large is downloaded: torch is found and kept, the rest is already satisfied."""
    readme = (REPO / "README.md").read_text()
    install = readme.split("## Two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [c.strip() for line in install.splitlines() if "pip install" in line for c in line.split("&&")]
    result = subprocess.run(["bash", str(REPO / "scripts" / "setup_ragen.sh"), "--dry-run"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and commands
    assert [line[2:] for line in result.stdout.splitlines() if line.startswith("+ pip")] == commands

    copy = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((REPO / name).read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(copy / ".venv")], check=True, timeout=120)
    refused = subprocess.run(["bash", str(copy / "scripts" / "setup_ragen.sh")], capture_output=True, text=True,
                             timeout=60, env=env)  # pip would be this venv's: the copy would be installed here
    assert refused.returncode == 1 and ".venv has no pip of its own" in refused.stderr, refused.stderr
    subprocess.run([str(copy / ".venv" / "bin" / "python"), "-m", "ensurepip", "--default-pip"], check=True,
                   capture_output=True, timeout=300)
    venv_site = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    outer_site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    Path(venv_site, "outer.pth").write_text(outer_site + "\n")
    result = subprocess.run(["bash", str(copy / "scripts" / "setup_ragen.sh")], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert ran == [c for c in commands if not c.startswith("pip install torch")]  # torch found: kept
    assert "installed: . .venv/bin/activate && bash train.sh bandit" in result.stdout
    check = ("import ragen, verl.utils.model as m; print(ragen.__file__); "
             "print(m.resolve_model_path('bundled:SmolLM2-135M-Instruct'))")
    shown = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c", check], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    module, model = shown.stdout.split()
    assert Path(module).is_relative_to(copy) and Path(model, "config.json").is_file()


def test_download_wandb_reads_records_split_over_blocks(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from ragen.utils.wandb import download_wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="p", name="e", dir=str(tmp_path))
    wide = {f"env/metric_{i:04d}": i / 7 for i in range(3000)}  # one row of ~90 KB: over several 32 KiB blocks
    for step in (1, 2):
        run.log({"actor/pg_loss": step / 10, **wide}, step=step)
    run.finish()
    rows = [json.loads(line) for line in
            (download_wandb(run.id, tmp_path / "out", roots=[tmp_path]) / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["actor/pg_loss"], row["env/metric_2999"]) for row in rows] == [(1, 0.1, 2999 / 7),
                                                                                           (2, 0.2, 2999 / 7)]
    assert (tmp_path / "out" / run.id / "plots").is_dir()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        download_wandb("nosuchrun", tmp_path / "out", roots=[tmp_path])


def test_read_history_waits_for_the_exit_record_the_service_writes_last(tmp_path, monkeypatch, capsys):
    """After run.finish() the service process may still be writing: the rows are read once the exit record is
    there (a run without one, still running or killed, gives its rows so far with a warning)."""
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    from ragen.utils import wandb as reader

    def record(kind: str, step: int = 0) -> bytes:
        r = wandb_internal_pb2.Record()
        if kind == "history":
            r.history.step.num = step
            item = r.history.item.add()
            item.key, item.value_json = "actor/pg_loss", json.dumps(step / 10)
        else:
            r.exit.exit_code = 0
        return r.SerializeToString()

    written = [[record("history", 1)], [record("history", 1), record("history", 2), record("exit")]]
    calls = []
    monkeypatch.setattr(reader, "read_records", lambda path: calls.append(path) or written[min(len(calls), 2) - 1])
    assert reader.read_history(tmp_path / "run.wandb") == [{"step": 1, "actor/pg_loss": 0.1},
                                                           {"step": 2, "actor/pg_loss": 0.2}]
    assert len(calls) == 2
    monkeypatch.setattr(reader, "read_records", lambda path: [record("history", 1)])
    assert reader.read_history(tmp_path / "run.wandb", wait_s=0.3) == [{"step": 1, "actor/pg_loss": 0.1}]
    assert "has no exit record" in capsys.readouterr().err
