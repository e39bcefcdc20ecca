"""scripts/boards_not_trained_on.py: each board shows what it says, and a call evaluates, tabulates and resumes."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen.overrides import load_config

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("boards_not_trained_on", REPO / "scripts" / "boards_not_trained_on.py")
boards_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(boards_script)


def shown_env(recipe: str, played: str, board: list[str]):
    cfg = load_config(recipe, [f"es_manager.val.env_configs.tags=[{played}]", *board])
    assert list(cfg.es_manager.val.env_configs.tags) == [played]
    return cfg, cfg.custom_envs[played]


def test_each_board_changes_what_it_names():
    expected = {  # board: (tag played, observation_format, separator, symbols, search_depth, actions)
        "as_trained": ("CoordSokoban", "grid_coord", " ", None, None, 10),
        "other_symbols": ("CoordSokoban", "grid_coord", " ", "W.T*BAa", None, 10),
        "different_grid_vocab": ("SokobanDifferentGridVocab", None, None, "W.T*BAa", None, 10),
        "deeper": ("CoordSokoban", "grid_coord", " ", None, 100, 20),
        "grid": ("CoordSokoban", "grid", " ", None, None, 10),
        "coord": ("CoordSokoban", "coord", " ", None, None, 10),
        "plain_grid": ("CoordSokoban", "grid", "", None, None, 10),
    }
    sokoban = boards_script.boards("sokoban", "CoordSokoban")
    assert list(sokoban) == list(expected)
    for name, (label, played, board) in sokoban.items():
        cfg, env = shown_env("sokoban", played, board)
        config = dict(env.env_config)
        tag, observation, separator, symbols, depth, actions = expected[name]
        assert (played, config.get("observation_format"), config.get("cell_separator"), config.get("symbols"),
                config.get("search_depth"), env.max_actions_per_traj) == expected[name], name
        assert cfg.agent_proxy.max_turn >= env.max_actions_per_traj  # the longer levels get the turns they need

    frozen_lake = boards_script.boards("frozen_lake", "CoordFrozenLake")
    assert list(frozen_lake) == ["as_trained", "grid", "coord", "plain_grid"]
    formats = [(dict(shown_env("frozen_lake", played, board)[1].env_config)["observation_format"],
                dict(shown_env("frozen_lake", played, board)[1].env_config)["cell_separator"])
               for _, played, board in frozen_lake.values()]
    assert formats == [("grid_coord", " "), ("grid", " "), ("coord", " "), ("grid", "")]
    with pytest.raises(SystemExit, match="sokoban and frozen_lake"):
        boards_script.boards("bandit", "Bandit")


def run_script(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "scripts/boards_not_trained_on.py", *args], capture_output=True,
                            text=True, timeout=900, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_evaluates_tabulates_and_reads_back(tiny_model_path, tmp_path):
    out = tmp_path / "sokoban"
    args = ["sokoban", tiny_model_path, "--groups", "2", "--out", str(out), "--boards", "coord",
            "agent_proxy.max_turn=2"]
    run_script(*args)
    summary = json.loads((out / "results.json").read_text())
    assert list(summary["boards"]) == ["coord"] and summary["groups"] == 2
    row, metrics = summary["boards"]["coord"], json.loads((out / "coord" / "metrics.json").read_text())
    assert row["success"] == metrics["val-env/CoordSokoban/success"] and 0 <= row["success"] <= 1
    assert set(row["reference"]) == {"random", "constant", "oracle"} and row["reference"]["oracle"] == 1.0
    assert summary["code"] == [row["code"]] and row["code"]  # the commit the evaluation ran
    records = [json.loads(line) for line in (out / "coord" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(len(r["turns"]) <= 2 for r in records)
    state = records[0]["turns"][0]["state"]
    assert "Player: (" in state and "#" not in state  # the coordinates alone, no grid
    assert "| the coordinates alone (`observation_format=coord`) |" in (out / "results.md").read_text()

    again = run_script(*args)  # the same call reads the evaluation back
    assert again.stdout.count("[boards] reusing") == 1 and "ragen.eval" not in again.stdout
    assert json.loads((out / "results.json").read_text())["boards"] == summary["boards"]
    with pytest.raises(AssertionError, match="unknown boards"):
        run_script("sokoban", tiny_model_path, "--out", str(out), "--boards", "coord,sideways")

    frozen = tmp_path / "frozen_lake"  # FrozenLake adds whether the moves depend on the map
    run_script("frozen_lake", tiny_model_path, "--groups", "2", "--out", str(frozen), "--boards", "grid",
               "agent_proxy.max_turn=2")
    row = json.loads((frozen / "results.json").read_text())["boards"]["grid"]
    assert row["map_dependence"]["episodes"] == 2 and row["map_dependence"]["policy_success"] == row["success"]
    assert "moves equal to the oracle's" in (frozen / "results.md").read_text()
