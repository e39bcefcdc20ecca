import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ragen.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv, optimal_policy, oracle_action
from ragen.envs.utils import TILE, shortest_path

INFO_KEYS = {"action_is_valid", "action_is_effective", "success"}
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
OPPOSITE = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}
SIDEWAYS = {"Left": ("Up", "Down"), "Right": ("Up", "Down"), "Up": ("Left", "Right"), "Down": ("Left", "Right")}
OPEN_MAP = ["FFF", "FSF", "FFG"]  # start in the middle: every direction leads to a different cell


def map_env(rows: list[str], is_slippery: bool = False, max_steps: int = 100, seed: int = 0):
    env = FrozenLakeEnv(FrozenLakeConfig(is_slippery=is_slippery, max_steps=max_steps))
    obs, _ = env.reset(seed=seed, options={"map": rows})
    return env, obs


def moved(cell: tuple[int, int], word: str, shape: tuple[int, int]) -> tuple[int, int]:
    """Where a move goes on the grid, written from the rules: the lake's edge stops the player."""
    row, col = cell[0] + MOVES[word][0], cell[1] + MOVES[word][1]
    return min(max(row, 0), shape[0] - 1), min(max(col, 0), shape[1] - 1)


def bfs_path(desc: np.ndarray) -> list[str] | None:
    """Shortest action words from the start to the goal that never enter a hole; the reference solver."""

    def successors(cell):
        for word in MOVES:
            nxt = moved(cell, word, desc.shape)
            if desc[nxt] != "H":
                yield word, nxt

    start = tuple(int(i) for i in np.argwhere(desc == "S")[0])
    return shortest_path(start, successors, lambda cell: desc[cell] == "G")


def rollout(env: FrozenLakeEnv, seed: int, choose) -> tuple[bool, int]:
    """Play one episode from `reset(seed)`; returns (success, valid steps taken)."""
    env.reset(seed=seed)
    for steps in range(1, env.config.max_steps + 1):
        _, _, terminated, truncated, info = env.step(choose(env))
        if terminated or truncated:
            return info["success"], steps
    raise AssertionError("the episode neither terminated nor truncated within max_steps")


@pytest.mark.parametrize("render_mode", ["ansi", "rgb_array"])
def test_passes_gymnasium_check_env(render_mode):
    check_env(FrozenLakeEnv(FrozenLakeConfig(), render_mode=render_mode))


def test_same_seed_same_map_and_obs_and_seeds_differ():
    env = FrozenLakeEnv(FrozenLakeConfig())
    starts = []
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert obs == env.render() and info == {}
        starts.append((obs, env.desc.tobytes()))
    assert starts == [(env.reset(seed=seed)[0], env.desc.tobytes()) for seed in range(20)]
    assert len(set(starts)) >= 15


def test_same_seed_same_slips_for_same_actions():
    actions = ["Down", "Right", "Right", "Down", "Up", "Left", "Down", "Right"] * 3

    def trajectory(env, seed, rng=None):
        observations = [env.reset(seed=seed)[0]]
        for action in actions:
            if rng is not None:
                env.sample_action(rng)  # must not touch the env's own randomness
            observations.append(env.step(action)[0])
        return observations

    first, second = FrozenLakeEnv(FrozenLakeConfig()), FrozenLakeEnv(FrozenLakeConfig())
    for seed in range(10):
        assert trajectory(first, seed) == trajectory(second, seed, np.random.default_rng(seed))
    # On one fixed map only the slips differ between seeds.
    fixed = [map_env(OPEN_MAP, is_slippery=True, seed=seed)[0] for seed in range(10)]
    ends = set()
    for seed, env in enumerate(fixed):
        for action in ["Up", "Left"]:
            env.step(action)
        ends.add(env.position)
        replay, _ = map_env(OPEN_MAP, is_slippery=True, seed=seed)
        replay.step("Up"), replay.step("Left")
        assert replay.position == env.position
    assert len(ends) >= 3


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("p", [0.5, 0.7, 0.9])
def test_every_generated_map_has_a_path(size, p):
    env = FrozenLakeEnv(FrozenLakeConfig(size=size, p=p))
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        rows = obs.split("\n")
        assert len(rows) == size and all(len(row) == size for row in rows)
        assert rows[0][0] == "P" and rows[-1][-1] == "G" and set(obs) <= set("P_OG\n")
        assert env.desc.shape == (size, size) and env.position == (0, 0)
        assert bfs_path(env.desc) is not None, f"seed {seed} has no path:\n{obs}"


@pytest.mark.parametrize("action", ["Left", "Down", "Right", "Up"])
def test_slippery_moves_go_intended_or_sideways_a_third_each(action):
    samples = 3000
    counts = dict.fromkeys(MOVES, 0)
    env = FrozenLakeEnv(FrozenLakeConfig(is_slippery=True))
    for seed in range(samples):
        env.reset(seed=seed, options={"map": OPEN_MAP})
        env.step(action)
        direction = [word for word in MOVES if moved((1, 1), word, (3, 3)) == env.position]
        assert len(direction) == 1, f"the player ended on {env.position}, not next to the start"
        counts[direction[0]] += 1
    assert counts[OPPOSITE[action]] == 0
    for word in (action, *SIDEWAYS[action]):
        assert counts[word] / samples == pytest.approx(1 / 3, abs=0.05), counts


def test_not_slippery_moves_are_deterministic():
    env = FrozenLakeEnv(FrozenLakeConfig(is_slippery=False, size=5))
    rng = np.random.default_rng(0)
    for seed in range(50):
        env.reset(seed=seed)
        for _ in range(30):
            action, before = env.sample_action(rng), env.position
            _, _, terminated, _, info = env.step(action)
            assert env.position == moved(before, action, env.desc.shape)
            assert info["action_is_effective"] == (env.position != before)
            if terminated:
                break


def test_reaching_the_goal_pays_and_terminates():
    env, obs = map_env(["SF", "HG"])
    assert obs == "P_\nOG"
    obs, reward, terminated, truncated, info = env.step("Right")
    assert (obs, reward, terminated, truncated) == ("_P\nOG", 0.0, False, False)
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
    obs, reward, terminated, truncated, info = env.step("Down")
    assert obs == "__\nO√"
    assert reward == 1.0 and type(reward) is float and terminated is True and truncated is False
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": True}
    # The manager stops here; stepping on must still work and change nothing.
    obs, reward, terminated, _, info = env.step("Left")
    assert obs == "__\nO√" and reward == 0.0 and terminated and set(info) == INFO_KEYS


def test_falling_in_a_hole_ends_without_reward():
    env, _ = map_env(["SH", "FG"])
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "_X\n_G"
    assert reward == 0.0 and terminated is True and truncated is False
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
    assert env.step("Down")[0] == "_X\n_G"


def test_move_into_the_edge_is_valid_but_not_effective():
    env, obs = map_env(["SF", "FG"])
    next_obs, reward, terminated, truncated, info = env.step("Up")
    assert next_obs == obs == "P_\n_G"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"action_is_valid": True, "action_is_effective": False, "success": False}


@pytest.mark.parametrize("action", ["", "jump", "<answer>Up</answer>", "Up Up", "U"])
def test_invalid_action_leaves_state_unchanged_and_is_not_a_step(action):
    env, obs = map_env(OPEN_MAP, is_slippery=True, max_steps=2)
    next_obs, reward, terminated, truncated, info = env.step(action)
    assert next_obs == obs and env.position == (1, 1)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"action_is_valid": False, "action_is_effective": False, "success": False}
    env, _ = map_env(["SF", "FG"], max_steps=2)
    env.step(action)
    assert not env.step("Left")[3], "the invalid action must not use up one of the two allowed steps"
    assert env.step("Left")[3]


def test_actions_match_ignoring_case_and_whitespace():
    env, _ = map_env(["SG", "FF"])
    assert env.step("  rIGHT \n")[4]["success"]


def test_truncates_after_max_steps_valid_actions():
    env, _ = map_env(["SF", "FG"], max_steps=3)
    results = [env.step(action) for action in ["Left", "Up", "Left"]]
    assert [truncated for *_, truncated, _ in results] == [False, False, True]
    assert not any(terminated for _, _, terminated, _, _ in results)
    env.reset(seed=0, options={"map": ["SF", "FG"]})
    assert not env.step("Left")[3], "reset restarts the step count"
    env, _ = map_env(["SG", "FF"], max_steps=1)
    _, _, terminated, truncated, _ = env.step("Right")
    assert terminated and not truncated, "reaching the goal on the last step is not a truncation"


def test_rgb_array_draws_one_tile_per_cell():
    for size in (4, 8):
        env = FrozenLakeEnv(FrozenLakeConfig(size=size), render_mode="rgb_array")
        obs, _ = env.reset(seed=1)
        assert isinstance(obs, str) and obs.startswith("P")
        picture = env.render()
        assert picture.shape == (size * TILE, size * TILE, 3) and picture.dtype == np.uint8
    env = FrozenLakeEnv(FrozenLakeConfig(is_slippery=False), render_mode="rgb_array")
    env.reset(options={"map": ["SH", "FG"]})
    centre = TILE // 2
    cells = {name: env.render()[r * TILE + centre, c * TILE + centre].tolist() for name, (r, c) in
             {"player": (0, 0), "hole": (0, 1), "ice": (1, 0), "goal": (1, 1)}.items()}
    assert len({tuple(colour) for colour in cells.values()}) == 4, cells
    env.step("Right")
    assert env.render()[centre, centre].tolist() == cells["ice"], "the start is ice once the player left"
    assert env.render()[centre, TILE + centre].tolist() == cells["player"], "the player is drawn over the hole"


def test_sample_action_draws_every_word_from_the_given_rng():
    env = FrozenLakeEnv(FrozenLakeConfig())
    draws = [env.sample_action(np.random.default_rng(7)) for _ in range(3)]
    assert len(set(draws)) == 1, "the same rng state gives the same action"
    rng = np.random.default_rng(0)
    assert {env.sample_action(rng) for _ in range(100)} == set(MOVES)


def test_instructions_mention_slipping_only_when_slippery():
    slippery = FrozenLakeEnv(FrozenLakeConfig(is_slippery=True)).instructions
    solid = FrozenLakeEnv(FrozenLakeConfig(is_slippery=False)).instructions
    assert "slippery" in slippery and "slippery" not in solid
    for text in (slippery, solid):
        assert all(word in text for word in MOVES) and all(symbol in text for symbol in "P_OGX√")
    assert set(FrozenLakeEnv(FrozenLakeConfig()).example_actions) <= set(MOVES)


def test_optimal_policy_hand_computed_maps():
    # Deterministic: from S go down, then right, to reach G around the hole. Holes and goal get 0.
    assert optimal_policy(["SH", "FG"], is_slippery=False).tolist() == [1, 0, 2, 0]
    # Slippery: any move from S but Up may slide into the hole below; Up can only stay or slide right.
    # From the top right, Right can only reach the goal or stay, while Down may slide back to S.
    assert optimal_policy(["SF", "HG"], is_slippery=True).tolist() == [3, 2, 0, 0]
    # gymnasium's classic 4x4 map: the well-known optimal slippery policy for gamma = 0.99
    # (cell 6 is a Left/Right tie, broken toward the lower action id).
    classic = ["SFFF", "FHFH", "FFFH", "HFFG"]
    assert optimal_policy(classic, is_slippery=True).tolist() == [0, 3, 3, 3, 0, 0, 0, 0, 3, 1, 0, 0, 0, 2, 1, 0]


def test_oracle_never_falls_where_a_safe_route_exists():
    env = FrozenLakeEnv(FrozenLakeConfig(is_slippery=True))
    for seed in range(50):
        env.reset(seed=seed, options={"map": ["SF", "HG"]})
        for _ in range(100):
            _, _, terminated, _, info = env.step(oracle_action(env))
            if terminated:
                break
        assert info["success"], f"seed {seed}: the oracle fell in the hole"


@pytest.mark.parametrize("size", [4, 8])
def test_oracle_walks_a_shortest_path_on_deterministic_maps(size):
    env = FrozenLakeEnv(FrozenLakeConfig(size=size, is_slippery=False))
    for seed in range(100):
        env.reset(seed=seed)
        expected = len(bfs_path(env.desc))
        success, steps = rollout(env, seed, oracle_action)
        assert success and steps == expected, f"seed {seed}: {steps} steps, BFS needs {expected}"


def test_oracle_beats_random_on_slippery_maps():
    env = FrozenLakeEnv(FrozenLakeConfig())  # slippery 4x4, p = 0.8
    rng = np.random.default_rng(0)
    seeds = range(200)
    oracle = np.mean([rollout(env, seed, oracle_action)[0] for seed in seeds])
    random = np.mean([rollout(env, seed, lambda e: e.sample_action(rng))[0] for seed in seeds])
    print(f"success over {len(seeds)} slippery 4x4 maps: oracle {oracle:.3f}, random {random:.3f}")
    assert oracle >= 0.75 and random <= 0.3 and oracle - random >= 0.5, (oracle, random)


def test_optimal_policy_rejects_gamma_outside_open_unit_interval():
    for gamma in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="gamma"):
            optimal_policy(["SG"], is_slippery=False, gamma=gamma)


@pytest.mark.parametrize(
    "rows, message",
    [
        (["SF", "F"], "same length"),
        ([], "same length"),
        (["SX", "FG"], "unknown letters"),
        (["SF", "SG"], "exactly one start"),
        (["SF", "FF"], "at least one goal"),
    ],
)
def test_bad_map_is_rejected(rows, message):
    with pytest.raises(ValueError, match=message):
        FrozenLakeEnv(FrozenLakeConfig()).reset(options={"map": rows})


def test_unknown_reset_option_and_render_mode_are_rejected():
    with pytest.raises(ValueError, match="desc"):
        FrozenLakeEnv(FrozenLakeConfig()).reset(options={"desc": ["SG"]})
    with pytest.raises(ValueError, match="human"):
        FrozenLakeEnv(FrozenLakeConfig(), render_mode="human")


@pytest.mark.parametrize(
    "kwargs, field",
    [({"size": 1}, "size"), ({"p": 0.0}, "p="), ({"p": 1.2}, "p="), ({"max_steps": 0}, "max_steps"),
     ({"cell_separator": ","}, "cell_separator")],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FrozenLakeConfig(**kwargs)


def test_cell_separator_spaces_the_cells_and_changes_nothing_else():
    plain, spaced = FrozenLakeEnv(FrozenLakeConfig()), FrozenLakeEnv(FrozenLakeConfig(cell_separator=" "))
    plain_obs, _ = plain.reset(seed=7)
    spaced_obs, _ = spaced.reset(seed=7)
    assert spaced_obs == "\n".join(" ".join(row) for row in plain_obs.split("\n"))
    for action in ["Down", "Right", "Right", "Down"]:
        plain_step, spaced_step = plain.step(action), spaced.step(action)
        assert spaced.observation_space.contains(spaced_step[0])
        assert spaced_step[0].replace(" ", "") == plain_step[0] and spaced_step[1:] == plain_step[1:]
