"""Our Sokoban against gym-sokoban, the reference the rewards and rules come from.

Rooms come from gym-sokoban's own generator; each room is loaded into both environments, and the same
action sequences (random ones, and our oracle's solution, which reaches the +10 branch) are played in
both. Every step must give the same reward, the same room and the same end of episode.

gym-sokoban is old-gym software: `gym.make` trips on numpy 2 (`np.bool8`, in gym's passive checker) and
its renderer loads pictures through `pkg_resources` (setuptools<81). So the reference env is built
directly, without `gym.make`, and its render is switched off. Needs the `test` extra (gym-sokoban,
setuptools<81); skipped without it.
"""

import contextlib
import functools
import io
import random
import warnings

import numpy as np
import pytest

from ragen.envs import sokoban
from ragen.envs.sokoban import SokobanConfig, SokobanEnv, solve_env

with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.simplefilter("ignore")  # pkg_resources' deprecation warning; gym prints an unmaintained notice
    pytest.importorskip("gym_sokoban", reason="needs the test extra: gym-sokoban and setuptools<81")
    from gym_sokoban.envs import room_utils
    from gym_sokoban.envs.sokoban_env import ACTION_LOOKUP, CHANGE_COORDINATES
    from gym_sokoban.envs.sokoban_env import SokobanEnv as ReferenceEnv

# gym-sokoban's cell codes: room_fixed holds the walls, floor and targets; room_state adds what moves.
REF_WALL, REF_TARGET, REF_BOX_ON_TARGET, REF_BOX, REF_PLAYER = 0, 2, 3, 4, 5
MAX_STEPS = 50  # below the number of random actions, so that truncation is compared too
NUM_RANDOM_ACTIONS = 60
NUM_ROOMS = 30


def reference_actions() -> dict[str, int]:
    """Our action words -> gym-sokoban's action ids, read off its tables: ids 1-4 push (or else move)."""
    ids = {}
    for action_id in range(1, 5):
        kind, word = ACTION_LOOKUP[action_id].split()
        assert kind == "push"
        ids[word.capitalize()] = action_id
        assert CHANGE_COORDINATES[action_id - 1] == sokoban.ACTIONS[word.capitalize()]
    assert sorted(ids) == sorted(sokoban.ACTIONS)
    return ids


def reference_room_text(room_fixed: np.ndarray, room_state: np.ndarray) -> str:
    """gym-sokoban's room in our default text symbols."""
    grid = np.full(room_fixed.shape, sokoban.FLOOR)
    targets = room_fixed == REF_TARGET
    boxes = np.isin(room_state, [REF_BOX, REF_BOX_ON_TARGET])
    player = room_state == REF_PLAYER
    grid[room_fixed == REF_WALL] = sokoban.WALL
    grid[targets] = sokoban.TARGET
    grid[boxes] = sokoban.BOX
    grid[boxes & targets] = sokoban.BOX_ON_TARGET
    grid[player] = sokoban.PLAYER
    grid[player & targets] = sokoban.PLAYER_ON_TARGET
    return "\n".join("".join(row) for row in grid)


@functools.cache
def reference_rooms(dim: int, num_boxes: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(room_fixed, room_state) pairs from gym-sokoban's generator, seeded 0, 1, ...; its failures skipped.

    The generator draws from the global `random` and `np.random`, so their states are restored afterwards.
    Cached for both tests; callers only read the rooms.
    """
    saved = random.getstate(), np.random.get_state()
    rooms = []
    try:
        for seed in range(3 * count):
            random.seed(seed)
            np.random.seed(seed)
            try:
                room_fixed, room_state, _ = room_utils.generate_room(
                    dim=(dim, dim), num_steps=int(1.7 * 2 * dim), num_boxes=num_boxes
                )
            except (RuntimeError, RuntimeWarning):  # "not enough free spots", "Generated Model with score == 0"
                continue
            rooms.append((room_fixed.astype(int), room_state.astype(int)))
            if len(rooms) == count:
                break
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    assert len(rooms) == count, f"gym-sokoban generated only {len(rooms)} of {count} rooms"
    return rooms


def reference_env(room_fixed: np.ndarray, room_state: np.ndarray, num_boxes: int) -> ReferenceEnv:
    env = ReferenceEnv(dim_room=room_fixed.shape, max_steps=MAX_STEPS, num_boxes=num_boxes, reset=False)
    env.render = lambda *args, **kwargs: None  # its renderer needs pkg_resources and image files
    env.room_fixed, env.room_state = room_fixed.copy(), room_state.copy()
    env.player_position = np.argwhere(room_state == REF_PLAYER)[0]
    env.num_env_steps = 0
    env.boxes_on_target = int((room_state == REF_BOX_ON_TARGET).sum())
    env.reward_last = 0
    return env


def play_both(room_fixed, room_state, num_boxes, actions: list[str]) -> int:
    """Play `actions` in both envs until the episode ends, asserting agreement; returns the steps played."""
    ids = reference_actions()
    ours = SokobanEnv(SokobanConfig(dim_x=room_fixed.shape[1], dim_y=room_fixed.shape[0], num_boxes=num_boxes,
                                    max_steps=MAX_STEPS))
    theirs = reference_env(room_fixed, room_state, num_boxes)
    obs, _ = ours.reset(options={"room": reference_room_text(room_fixed, room_state)})
    assert obs == reference_room_text(theirs.room_fixed, theirs.room_state)
    for step, action in enumerate(actions, start=1):
        obs, reward, terminated, truncated, info = ours.step(action)
        _, their_reward, their_done, their_info = theirs.step(ids[action])
        where = f"step {step} ({action}) of\n{reference_room_text(room_fixed, room_state)}"
        assert obs == reference_room_text(theirs.room_fixed, theirs.room_state), where
        assert reward == their_reward, where
        assert (terminated or truncated) == their_done, where
        assert info["action_is_effective"] == their_info["action.moved_player"], where
        if their_done:
            assert terminated == their_info["all_boxes_on_target"], where
            return step
    return len(actions)


@pytest.mark.parametrize("dim, num_boxes", [(6, 1), (8, 2)])
def test_random_play_matches_gym_sokoban(dim, num_boxes):
    rng = np.random.default_rng(dim)
    words = list(sokoban.ACTIONS)
    truncations = 0
    for room_fixed, room_state in reference_rooms(dim, num_boxes, NUM_ROOMS):
        actions = [words[i] for i in rng.integers(len(words), size=NUM_RANDOM_ACTIONS)]
        truncations += play_both(room_fixed, room_state, num_boxes, actions) == MAX_STEPS
    assert truncations > 0, "some random episodes should run into the step limit"


@pytest.mark.parametrize("dim, num_boxes", [(6, 1), (8, 2)])
def test_oracle_solution_matches_gym_sokoban_including_the_solve(dim, num_boxes):
    for room_fixed, room_state in reference_rooms(dim, num_boxes, NUM_ROOMS):
        env = SokobanEnv(SokobanConfig(dim_x=dim, dim_y=dim, num_boxes=num_boxes))
        env.reset(options={"room": reference_room_text(room_fixed, room_state)})
        solution = solve_env(env)
        assert solution, "gym-sokoban's rooms are solvable by construction"
        assert play_both(room_fixed, room_state, num_boxes, solution) == len(solution)
