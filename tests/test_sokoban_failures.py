"""scripts/sokoban_failures.py: how greedy Sokoban episodes fail, on episodes played in the real environment."""

import functools
import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from ragen.envs import make_env
from ragen.overrides import load_config

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("sokoban_failures", REPO / "scripts" / "sokoban_failures.py")
sokoban_failures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sokoban_failures)


@functools.cache
def recipe_env():
    env_spec = load_config("sokoban", []).custom_envs["CoordSokoban"]
    return make_env(env_spec.env_type, dict(env_spec.env_config))


def play(moves: list[str], seed: int) -> dict:
    """One episode of the recipe's board, recorded as the trainer records it, playing `moves` one a turn."""
    env = recipe_env()
    state, _ = env.reset(seed=seed)
    turns, success = [], False
    for move in moves:
        shown = state
        state, _, terminated, truncated, info = env.step(move)
        turns.append({"state": shown, "actions": [move], "action_effective": [bool(info["action_is_effective"])]})
        success = success or bool(info["success"])
        if terminated or truncated:
            break
    return {"seed": seed, "success": success, "turns": turns, "final_state": state}


def test_a_constant_move_gets_stuck_and_a_back_and_forth_walks_between_two_states():
    constant = [play(["Up"] * 10, seed) for seed in range(20)]
    assert any(not episode["success"] for episode in constant)
    for episode in constant:
        if not episode["success"]:  # ten turns on a 6 x 6 board: the last four all walk into the wall
            assert sokoban_failures.failure_kind(episode, last=4) == "stuck"
    walks = [play(["Left", "Right"] * 5, seed) for seed in range(20)]
    walking = [episode for episode in walks if not episode["success"]
               and all(turn["action_effective"] == [True] for turn in episode["turns"])]
    assert walking  # some start states leave room to step left and back
    assert all(sokoban_failures.failure_kind(episode, last=4) == "two-state walk" for episode in walking)
    wandering = {"seed": 0, "success": False, "turns": [
        {"state": s, "actions": [m], "action_effective": [True]} for s, m in zip("abcd", ["Up", "Left", "Down", "Up"])]}
    assert sokoban_failures.failure_kind(wandering, last=4) == "other"


def test_the_command_counts_each_kind_and_the_moves_that_changed_nothing(tmp_path):
    episodes = [play(["Up"] * 10, seed) for seed in range(8)]
    path = tmp_path / "episodes.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps(episode) + "\n" for episode in episodes)
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "sokoban_failures.py"), str(path),
                             "--json", str(tmp_path / "figures.json")], capture_output=True, text=True, check=True)
    figures = json.loads((tmp_path / "figures.json").read_text())[str(path)]
    failed = sum(not episode["success"] for episode in episodes)
    assert figures["failed"] == {"stuck": failed, "two-state walk": 0, "other": 0}
    moves = [ok for episode in episodes for turn in episode["turns"] for ok in turn["action_effective"]]
    assert abs(figures["noop_share"] - moves.count(False) / len(moves)) < 1e-9
    assert f"solved {len(episodes) - failed} of {len(episodes)}" in result.stdout


def test_levels_are_counted_by_the_length_of_their_shortest_solution():
    from ragen.envs.sokoban import solve_env

    env = recipe_env()
    episodes, lengths = [], []
    for seed in range(12):
        env.reset(seed=seed)
        plan = solve_env(env)
        lengths.append(len(plan))
        episodes.append(play(plan if seed % 2 else ["Up"] * 10, seed))  # odd seeds solved by the oracle's plan
    assert all(sokoban_failures.shortest_solution(episode) == n for episode, n in zip(episodes, lengths))
    by_length = sokoban_failures.summarize(episodes, last=4)["solved_by_shortest_solution"]
    assert sum(count for _, count in by_length.values()) == 12
    for n, (won, count) in by_length.items():
        assert count == lengths.count(int(n))
        assert won == sum(episode["success"] for episode, m in zip(episodes, lengths) if m == int(n))
    other_symbols = {"turns": [{"state": episodes[0]["turns"][0]["state"].replace("#", "W")}]}
    assert sokoban_failures.shortest_solution(other_symbols) == "unknown"


def test_each_turn_is_judged_against_the_oracles_moves_to_go_and_a_failure_by_its_first_mistake():
    from ragen.envs.sokoban import ACTIONS, solve_env

    env = recipe_env()
    found = {}  # kind -> (seed, moves): the oracle's first moves, then one mistake of that kind; one kind a level
    for seed in range(50):
        env.reset(seed=seed)
        plan = solve_env(env)
        for turn in range(len(plan)):
            for move in ACTIONS:
                episode = play(plan[:turn] + [move], seed)
                if move == plan[turn] or episode["success"]:
                    continue
                after, left = sokoban_failures.moves_to_go(episode["final_state"]), len(plan) - turn
                kind = ("no effect" if not episode["turns"][-1]["action_effective"][0]
                        else "dead end" if after is None else "detour" if after > left - 1 else None)
                if kind and kind not in found and seed not in [level for level, _ in found.values()]:
                    found[kind] = (seed, plan[:turn] + [move])
        if len(found) == 3:
            break
    assert set(found) == {"no effect", "dead end", "detour"}
    failures = []
    for kind, (seed, moves) in found.items():
        episode = play(moves + ["Up"] * (10 - len(moves)), seed)  # then whatever
        verdicts = sokoban_failures.path_turns(episode)
        assert verdicts[:len(moves)] == ["shortest"] * (len(moves) - 1) + [kind]
        if kind == "dead end":  # nothing after a dead end is judged
            assert len(verdicts) == len(moves)
        if not episode["success"]:
            failures.append((episode, len(moves) - 1, kind))
    summary = sokoban_failures.summarize([episode for episode, _, _ in failures], last=4)
    assert sum(summary["first_mistake"].values()) == len(failures) > 0
    for episode, turn, kind in failures:
        first = summary["first_mistakes"][episode["seed"]]
        assert (first["turn"], first["kind"]) == (turn, kind)
        assert first["slack"] == len(episode["turns"]) - sokoban_failures.shortest_solution(episode)
    oracle = []
    for seed in range(5):
        env.reset(seed=seed)
        oracle.append(play(solve_env(env), seed))
    assert all(episode["success"] for episode in oracle)
    assert sokoban_failures.summarize(oracle, last=4)["shortest_path_share"] == 1.0


def test_a_move_toward_the_box_heads_at_its_row_or_column():
    state = "\n".join(["# # # # # #", "# _ _ _ _ #", "# _ X _ _ #", "# _ _ _ P #", "# O _ _ _ #", "# # # # # #"])
    assert sokoban_failures.toward_box(state, "Up") and sokoban_failures.toward_box(state, "Left")
    assert not sokoban_failures.toward_box(state, "Down") and not sokoban_failures.toward_box(state, "Right")
