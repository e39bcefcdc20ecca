"""The gym_sokoban env (ragen/envs/gym_sokoban.py): gym-sokoban's levels and rules behind RAGEN's text interface.

Needs the `test` extra (gym-sokoban==0.0.6, setuptools<81); skipped without it. Serving it from a venv of its
own is tests/ragen/envs/test_env_venv.py.
"""

import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ragen.envs import check_env, make_env
from ragen.envs.sokoban import ACTIONS, SokobanConfig, SokobanEnv, parse_room, solve

pytest.importorskip("gym_sokoban", reason="needs the test extra: gym-sokoban and setuptools<81")

# seed 0's level (default config: 6x6, one box) and a solution found by hand: push the box left, walk round it,
# push it down twice onto the target
SEED_0_LEVEL = "######\n#____#\n#__XP#\n#__#_#\n#_O###\n######"
SEED_0_SOLUTION = ["Left", "Up", "Left", "Down", "Down"]


def play(env, seed: int, actions: list[str]) -> list[tuple]:
    """The episode of `actions` from reset(seed), up to its end: observations, rewards, flags and info."""
    transcript = [env.reset(seed=seed)[0]]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        transcript.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return transcript


def random_actions(seed: int, count: int = 30) -> list[str]:
    words = list(ACTIONS)
    return [words[i] for i in np.random.default_rng([seed, 7]).integers(len(words), size=count)]


def test_seed_0_is_gym_sokobans_level_and_the_hand_solution_solves_it():
    env = make_env("gym_sokoban")
    assert env.reset(seed=0)[0] == SEED_0_LEVEL
    *_, (obs, reward, terminated, truncated, info) = play(env, 0, SEED_0_SOLUTION)
    assert obs == "######\n#____#\n#____#\n#_P#_#\n#_√###\n######"
    assert (reward, terminated, truncated, info["success"]) == (pytest.approx(10.9), True, False, True)


def test_solver_solutions_solve_with_gym_sokobans_rewards():
    """RAGEN's Sokoban oracle solves each level read off the text; the env agrees: -0.1 a move, +1 for the box
    on its target and +10 for the solve, on the last move only."""
    env = make_env("gym_sokoban")
    for seed in range(20):
        solution = solve(*parse_room(env.reset(seed=seed)[0]))
        assert solution, f"gym-sokoban's levels are solvable by construction (seed {seed})"
        _, *steps = play(env, seed, solution)
        assert len(steps) == len(solution)
        assert [reward for _, reward, *_ in steps] == pytest.approx([-0.1] * (len(solution) - 1) + [10.9])
        assert [(terminated, truncated, info["success"]) for _, _, terminated, truncated, info in steps] == \
            [(False, False, False)] * (len(solution) - 1) + [(True, False, True)]


def test_the_same_seed_gives_the_same_episode_also_with_concurrent_sessions():
    """gym-sokoban generates from the process-wide random state: levels made in many threads at once (as a
    server's sessions are) must still be each seed's own, and the global state is left as it was."""
    seeds = list(range(24))
    expected = {seed: play(make_env("gym_sokoban"), seed, random_actions(seed)) for seed in seeds}
    assert len({transcript[0] for transcript in expected.values()}) > 10  # seeds give different levels

    def episodes(offset: int) -> dict[int, list]:
        env = make_env("gym_sokoban")
        order = seeds[offset:] + seeds[:offset]
        return {seed: play(env, seed, random_actions(seed)) for seed in order}

    random.seed(123)
    np.random.seed(123)
    before = random.getstate(), np.random.get_state()[1].copy()
    with ThreadPoolExecutor(8) as pool:
        for result in pool.map(episodes, range(0, 24, 3)):
            assert result == expected
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])


@pytest.mark.parametrize("observation_format, cell_separator", [("grid", ""), ("grid_coord", " "), ("coord", "")])
def test_the_text_is_ragen_sokobans_for_the_same_room(observation_format, cell_separator):
    """The same room loaded into RAGEN's Sokoban, in each observation format, reads the same before and after
    every move of a random episode, with the same rewards and flags."""
    style = {"observation_format": observation_format, "cell_separator": cell_separator}
    ours = make_env("gym_sokoban", style)
    theirs = SokobanEnv(SokobanConfig(**style))
    assert ours.instructions == theirs.instructions
    for seed in range(10):
        room = make_env("gym_sokoban").reset(seed=seed)[0]  # the "grid" text, which parse_room reads
        actions = random_actions(seed)
        assert ours.reset(seed=seed)[0] == theirs.reset(options={"room": room})[0]
        for action in actions:
            result = ours.step(action)
            assert result == theirs.step(action)
            if result[2] or result[3]:
                break


@pytest.mark.parametrize("action", ["", "up up", "Push up", "<answer>Up</answer>", "4", "north", "\x00"])
def test_an_action_not_understood_is_invalid_and_changes_nothing(action):
    env = make_env("gym_sokoban", {"max_steps": 2})
    start = env.reset(seed=0)[0]
    assert env.step(action) == (start, 0.0, False, False,
                                {"action_is_valid": False, "action_is_effective": False, "success": False})
    # nor does it count toward max_steps: two valid moves after it, and only the second ends the episode
    assert env.step(" left ")[1:4] == (-0.1, False, False)
    assert env.step("UP")[1:4] == (-0.1, False, True)


@pytest.mark.parametrize("env_config", [{}, {"observation_format": "grid_coord", "cell_separator": " "},
                                        {"observation_format": "coord", "dim_x": 7, "num_boxes": 2}])
def test_check_env_passes(env_config):
    check_env(make_env("gym_sokoban", env_config), seed=3)


def test_ragen_envs_imports_without_gym_sokoban_and_building_without_it_says_how_to_install():
    code = ("import sys; sys.modules['gym_sokoban'] = None\n"  # as if not installed: importing it fails
            "from ragen.envs import make_env\n"
            "make_env('gym_sokoban')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "ImportError: the gym_sokoban env needs gym-sokoban==0.0.6" in result.stderr
    assert "scripts/make_env_venv.sh gym_sokoban" in result.stderr
