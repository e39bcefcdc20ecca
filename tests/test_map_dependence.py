"""scripts/map_dependence.py: exact constant-move odds, and what it says of a blind and of a map-reading policy."""

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.envs.toy_text import frozen_lake as gym_frozen_lake

from ragen.envs import make_env
from ragen.envs.baselines import ConstantAgent, OracleAgent, evaluate
from ragen.overrides import load_config

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("map_dependence", REPO / "scripts" / "map_dependence.py")
map_dependence = importlib.util.module_from_spec(spec)
spec.loader.exec_module(map_dependence)

TAG = "CoordFrozenLake"
OVERRIDES = [f"es_manager.val.env_configs.tags=[{TAG}]"]


def play(agent, seeds: range) -> list[dict]:
    """Episodes as the trainer records them (tag, seed, success, turns with state and actions), one move a turn."""
    spec = load_config("frozen_lake", OVERRIDES).custom_envs[TAG]
    env = make_env(spec.env_type, dict(spec.env_config))
    records = []
    for seed in seeds:
        state, _ = env.reset(seed=seed)
        agent.reset()
        turns, success = [], False
        for _ in range(spec.max_actions_per_traj):
            action = agent.act(env)
            turns.append({"state": state, "actions": [action]})
            state, _, terminated, truncated, info = env.step(action)
            success = success or info["success"]
            if terminated or truncated:
                break
        records.append({"tag": TAG, "seed": seed, "success": success, "turns": turns})
    return records


def test_exact_odds_match_play_and_a_deterministic_map():
    rows = ["SFFF", "FHFH", "FFFH", "HFFG"]
    table = gym_frozen_lake.FrozenLakeEnv(desc=rows, is_slippery=False).P
    down = np.full(16, 1)  # gymnasium's Down
    # without slips Down walks into the hole at (3, 0); Right then Down is the only way, never a constant move
    assert map_dependence.success_probability(table, 0, down, 20) == 0.0
    oracle = map_dependence.optimal_policy(rows, False)
    assert map_dependence.success_probability(table, 0, oracle, 6) == 1.0
    assert map_dependence.success_probability(table, 0, oracle, 5) == 0.0  # six moves are needed
    # what a move gives up: with exactly six actions, bumping the wall costs the goal, and so does a turn without a
    # valid move when turns are as scarce as actions; an invalid answer is not charged to the action budget
    q = map_dependence.best_action_values(table, 6)
    assert q[6, 0].max() == 1.0 and q[5, 0].max() == 0.0
    given_up = lambda action, max_turn: map_dependence.success_given_up(  # noqa: E731
        [{"state": "Player: (0, 0)", "actions": [action]}], q, 4, max_turn)
    assert given_up("Down", 6) == given_up("Right", 6) == 0.0 and given_up("Up", 6) == 1.0
    assert given_up("Jump", 6) == 1.0 and given_up("Jump", 20) == 0.0
    assert map_dependence.success_given_up([{"state": "Player: (0, 0)", "actions": ["Down", "Down"]}],
                                           q, 4, 6) is None  # the cell between two moves is unknown

    # on slippery maps: the expected success of pressing Down, against 600 played episodes
    seeds = range(500, 1100)
    figures = map_dependence.analyse(play(ConstantAgent("Down"), seeds), "frozen_lake", OVERRIDES)
    played = evaluate(make_env("frozen_lake", dict(load_config("frozen_lake", OVERRIDES).custom_envs[TAG].env_config)),
                      ConstantAgent("Down"), seeds, 20).success_rate
    expected = figures["constant_success"]["Down"]
    assert abs(played - expected) < 3 * np.sqrt(expected * (1 - expected) / len(seeds)) + 1e-9
    assert figures["policy_success"] == pytest.approx(played)
    # the estimate with the slips' luck taken out aims at the same odds, and spreads less than reaching the goal
    assert abs(figures["expected_success"] - expected) < 3 * figures["expected_success_stderr"]
    assert figures["expected_success_stderr"] < figures["policy_success_stderr"]


def test_a_blind_policy_and_the_oracle_are_told_apart():
    seeds = range(2000, 2200)
    blind = map_dependence.analyse(play(ConstantAgent("Down"), seeds), "frozen_lake", OVERRIDES)
    assert blind["first_answers"] == {"Down": 200} and blind["first_answer_not_the_commonest"] == 0.0
    assert blind["episodes_best_constant_rarely_solves"] > 0
    assert blind["there"]["best_constant"] < 0.05 < blind["there"]["oracle"]
    oracle = map_dependence.analyse(play(OracleAgent(0), seeds), "frozen_lake", OVERRIDES)
    assert oracle["oracle_agreement"] == 1.0
    assert len(oracle["first_answers"]) > 1 and oracle["first_answer_not_the_commonest"] > 0
    assert oracle["first_answers"] == oracle["oracle_first_answers"]
    assert oracle["policy_success"] > blind["policy_success"]
    assert oracle["there"]["policy"] > 0.05 > blind["there"]["policy"]
    assert blind["oracle_agreement"] < 0.6
    assert abs(oracle["expected_success"] - oracle["oracle_success"]) < 3 * oracle["expected_success_stderr"]
    assert oracle["best_success"] >= oracle["oracle_success"] > blind["expected_success"]


def test_the_command_line(tmp_path):
    episodes = tmp_path / "val.jsonl"
    episodes.write_text("".join(json.dumps(r) + "\n" for r in play(OracleAgent(0), range(3000, 3020))))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "map_dependence.py"), str(episodes), *OVERRIDES,
                          "--json", str(tmp_path / "figures.json")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "20 episodes on 20 maps" in out.stdout and "oracle's at the cell stood on: 100.0%" in out.stdout
    assert json.loads((tmp_path / "figures.json").read_text())["episodes"] == 20
    # against the oracle on the same maps, pressing Down gives up success, measured map by map (gzipped files too)
    blind = tmp_path / "down.jsonl.gz"
    with gzip.open(blind, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in play(ConstantAgent("Down"), range(3000, 3020))))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "map_dependence.py"), str(blind), *OVERRIDES,
                          "--against", str(episodes), "--json", str(tmp_path / "down.json")],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    against = json.loads((tmp_path / "down.json").read_text())["against"]
    assert against["maps"] == 20 and against["change"] > 3 * against["stderr"] > 0
    assert "map by map over 20 maps" in out.stdout
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "map_dependence.py"), str(empty)],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode != 0 and "holds no episodes" in out.stderr
