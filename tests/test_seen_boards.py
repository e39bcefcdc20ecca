"""scripts/seen_boards.py: which held-out boards were training boards, and success on each part."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

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
