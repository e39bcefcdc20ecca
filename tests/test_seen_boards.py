"""scripts/seen_boards.py: which held-out boards were training boards, and success on each part."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragen.envs import make_env
from ragen.envs.baselines import ConstantAgent
from ragen.overrides import load_config
from tests.test_map_dependence import play  # episodes as the trainer records them

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("seen_boards", REPO / "scripts" / "seen_boards.py")
seen_boards = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seen_boards)

TAG = "CoordFrozenLake"


def test_held_out_seeds_are_split_by_their_maps(tmp_path):
    env_spec = load_config("frozen_lake", []).custom_envs[TAG]
    env = make_env(env_spec.env_type, dict(env_spec.env_config))

    def lake(seed):  # the map itself, not its text: an independent way to tell boards apart
        env.reset(seed=seed)
        return env.unwrapped.desc.tobytes()

    train, held_out = range(0, 300), range(5_000_000, 5_000_060)
    known = {lake(seed) for seed in train}
    expected_seen = sum(lake(seed) in known for seed in held_out)
    assert 0 < expected_seen < len(held_out)  # small maps repeat, and not all of them

    records = play(ConstantAgent("Down"), list(train[:10]) + list(held_out))
    cfg = load_config("frozen_lake", [])
    boards = seen_boards.training_boards(cfg, {TAG}, [train])
    parts = seen_boards.split_by_seen(records, cfg, boards)
    assert len(parts["seen"]) == 10 + expected_seen  # a training seed is a training board
    assert len(parts["unseen"]) == len(held_out) - expected_seen

    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "seen_boards.py"), str(path), "--recipe",
                           "frozen_lake", "--train-seeds", "0:300", "--json", str(tmp_path / "seen.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads((tmp_path / "seen.json").read_text())[str(path)]
    for name, part in parts.items():
        assert figures[name]["episodes"] == len(part)
        assert abs(figures[name]["success"] - sum(r["success"] for r in part) / len(part)) < 1e-12
        assert 0 <= figures[name]["expected_success"] <= figures[name]["best_success"] + 1e-9
    assert "on boards not seen" in done.stdout
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "seen_boards.py"), str(path), "--recipe",
                          "frozen_lake", "--train-seeds", "300"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "is not START:END" in bad.stderr


def test_picked_test_seeds_hold_new_boards_each_once():
    env_spec = load_config("frozen_lake", []).custom_envs[TAG]
    env = make_env(env_spec.env_type, dict(env_spec.env_config))

    def lake(seed):
        env.reset(seed=seed)
        return env.unwrapped.desc.tobytes()

    cfg = load_config("frozen_lake", [])
    train = range(0, 300)
    seeds = seen_boards.pick_unseen(cfg, seen_boards.training_boards(cfg, {TAG}, [train]), 5_000_000, 40)
    known = {lake(seed) for seed in train}
    maps = [lake(seed) for seed in seeds]
    assert len(seeds) == 40 and seeds == sorted(seeds) and seeds[0] >= 5_000_000
    assert not known & set(maps) and len(set(maps)) == 40  # none trained on, none twice
    skipped = set(range(5_000_000, seeds[-1])) - set(seeds)
    assert skipped and all(lake(seed) in known or lake(seed) in maps for seed in skipped)  # the first such seeds

    done = subprocess.run([sys.executable, str(REPO / "scripts" / "seen_boards.py"), "--recipe", "frozen_lake",
                           "--train-seeds", "0:300", "--pick-unseen", "5000000", "--groups", "40"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [f"es_manager.val.seeds=[{','.join(map(str, seeds))}]", "es_manager.val.env_groups=40"]
    other = subprocess.run([sys.executable, str(REPO / "scripts" / "seen_boards.py"), "--recipe", "frozen_lake",
                            "--train-seeds", "0:300", "--pick-unseen", "5000000", "--groups", "40",
                            "custom_envs.CoordFrozenLake.env_config.size=5"], capture_output=True, text=True, cwd=REPO)
    assert other.returncode == 0, other.stderr[-2000:]  # an override reaches the config: other maps, other picks
    assert other.stdout.split()[0] != done.stdout.split()[0]
    bandit = load_config("bandit", [])  # two start boards: too few for 8 new ones
    with pytest.raises(ValueError, match="too few distinct boards"):
        seen_boards.pick_unseen(bandit, {}, 0, 8, tries=50)


def test_sokoban_success_is_also_split_by_the_length_of_the_shortest_solution():
    """The oracle, played for real within the action budget, solves exactly the boards whose shortest solution fits."""
    from ragen.envs.baselines import OracleAgent, evaluate

    cfg = load_config("sokoban", [])
    tag = cfg.es_manager.val.env_configs.tags[0]
    env, budget = seen_boards.tag_env(cfg, tag), cfg.custom_envs[tag].max_actions_per_traj
    seeds = range(127_000_000, 127_000_060)
    records = [{"tag": tag, "seed": seed, "success": evaluate(env, OracleAgent(), [seed], budget).success_rate == 1.0}
               for seed in seeds]
    rows = seen_boards.by_solution_length(records, cfg)
    assert sum(row["episodes"] for row in rows.values()) == len(seeds)
    assert all(row["success"] == (moves != "none" and int(moves) <= budget) for moves, row in rows.items())
    assert any(int(moves) > budget for moves in rows if moves != "none")  # some levels take longer than the budget
    result = seen_boards.figures(records, cfg, "sokoban", [], seen_boards.training_boards(cfg, {tag}, [range(2000)]))
    assert "by_solution_length" in result["unseen"]
    assert "solved by the moves of the shortest solution" in seen_boards.report(Path("x.jsonl"), result)
