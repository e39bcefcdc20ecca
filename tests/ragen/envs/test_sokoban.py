from collections import deque

import pytest
from gymnasium.utils.env_checker import check_env

from ragen.envs.sokoban import SokobanConfig, SokobanEnv

INFO_KEYS = {"action_is_valid", "action_is_effective", "success"}
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def solve(grid: str, max_moves: int = 200) -> list[str] | None:
    """Breadth-first search over (player, boxes) for the shortest action sequence that solves the grid.

    The reference for solvability: written from the rules alone, sharing no code with the environment.
    """
    walls, targets, boxes, player = set(), set(), set(), None
    for r, row in enumerate(grid.split("\n")):
        for c, ch in enumerate(row):
            cell = (r, c)
            if ch == "#":
                walls.add(cell)
            if ch in "O√S":
                targets.add(cell)
            if ch in "X√":
                boxes.add(cell)
            if ch in "PS":
                player = cell
    start = (player, frozenset(boxes))
    parents = {start: None}
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        player, boxes = state
        if boxes == targets:
            path = []
            while parents[state] is not None:
                state, action = parents[state]
                path.append(action)
            return path[::-1]
        if depth == max_moves:
            continue
        for action, (dr, dc) in MOVES.items():
            ahead = (player[0] + dr, player[1] + dc)
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if ahead in walls:
                continue
            next_boxes = boxes
            if ahead in boxes:
                if beyond in walls or beyond in boxes:
                    continue
                next_boxes = boxes - {ahead} | {beyond}
            next_state = (ahead, next_boxes)
            if next_state not in parents:
                parents[next_state] = (state, action)
                frontier.append((next_state, depth + 1))
    return None


def room_env(room: str, max_steps: int = 100) -> tuple[SokobanEnv, str]:
    env = SokobanEnv(SokobanConfig(max_steps=max_steps))
    obs, _ = env.reset(seed=0, options={"room": room})
    return env, obs


def test_passes_gymnasium_check_env():
    check_env(SokobanEnv(SokobanConfig()))


def test_same_seed_same_level_and_seeds_differ():
    env = SokobanEnv(SokobanConfig())
    levels = [env.reset(seed=seed)[0] for seed in range(20)]
    assert levels == [env.reset(seed=seed)[0] for seed in range(20)]
    assert len(set(levels)) >= 15
    room_shapes = {"".join("#" if ch == "#" else "." for ch in level) for level in levels}
    assert len(room_shapes) >= 10, "the room topology itself must vary with the seed"


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_generated_levels_are_solvable_and_well_formed(num_boxes):
    config = SokobanConfig(num_boxes=num_boxes, dim_x=6 + num_boxes, dim_y=6 + num_boxes)
    env = SokobanEnv(config)
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        assert obs == env.render()
        rows = obs.split("\n")
        assert len(rows) == config.dim_y and all(len(row) == config.dim_x for row in rows)
        assert set(rows[0]) == set(rows[-1]) == {"#"} and all(row[0] == row[-1] == "#" for row in rows)
        assert obs.count("X") == num_boxes, "every box starts off its target"
        assert obs.count("O") + obs.count("S") == num_boxes
        assert obs.count("P") + obs.count("S") == 1

        solution = solve(obs)
        assert solution, f"seed {seed} has no solution within 200 moves:\n{obs}"
        # The environment agrees with the reference: the solution solves it, with the expected reward.
        total = 0.0
        for i, action in enumerate(solution):
            _, reward, terminated, truncated, info = env.step(action)
            assert set(info) == INFO_KEYS and info["action_is_valid"]
            assert terminated == info["success"] == (i == len(solution) - 1)
            assert not truncated
            total += reward
        # Pushes onto and off targets cancel out except for the num_boxes boxes that end on one.
        assert total == pytest.approx(10.0 + num_boxes - 0.1 * len(solution))


def test_push_onto_target_solves():
    env, _ = room_env("#####\n#PXO#\n#####")
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "#####\n#_P√#\n#####"
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
    assert terminated and not truncated
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": True}


def test_push_off_target_costs():
    env, _ = room_env("######\n#P√_O#\n#X___#\n######")
    obs, reward, terminated, _, info = env.step("Right")
    assert obs == "######\n#_SXO#\n#X___#\n######"
    assert reward == pytest.approx(-1.1)
    assert not terminated and info["action_is_effective"] and not info["success"]
    _, reward, terminated, _, _ = env.step("Right")
    assert reward == pytest.approx(0.9) and not terminated, "one box on target, one still off"


def test_plain_move_costs_a_step():
    env, _ = room_env("######\n#P_XO#\n######")
    obs, reward, terminated, truncated, info = env.step("right")
    assert obs == "######\n#_PXO#\n######"
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}


@pytest.mark.parametrize(
    "room, action",
    [
        ("#####\n#PXO#\n#####", "Left"),  # wall
        ("#####\n#PXO#\n#####", "Up"),  # wall
        ("#####\n#OPX#\n#####", "Right"),  # box against a wall
        ("######\n#PXX_#\n#OO__#\n######", "Right"),  # box against a box
    ],
)
def test_blocked_move_is_valid_but_not_effective(room, action):
    env, obs = room_env(room)
    next_obs, reward, terminated, truncated, info = env.step(action)
    assert next_obs == obs
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info == {"action_is_valid": True, "action_is_effective": False, "success": False}


@pytest.mark.parametrize("action", ["Jump", "", "up left", "U"])
def test_invalid_action_leaves_state_unchanged_and_is_not_a_step(action):
    env, obs = room_env("######\n#P_XO#\n######", max_steps=2)
    next_obs, reward, terminated, truncated, info = env.step(action)
    assert next_obs == obs
    assert reward == 0.0 and not terminated and not truncated
    assert info == {"action_is_valid": False, "action_is_effective": False, "success": False}
    assert not env.step("Left")[3], "the invalid action must not use up one of the two allowed steps"
    assert env.step("Left")[3]


def test_actions_match_ignoring_case_and_whitespace():
    env, _ = room_env("#####\n#PXO#\n#####")
    assert env.step("  rIGHT \n")[4]["success"]


def test_truncates_after_max_steps_valid_actions():
    env, _ = room_env("######\n#P_XO#\n######", max_steps=3)
    results = [env.step(action) for action in ["Left", "Right", "Left"]]
    assert [truncated for *_, truncated, _ in results] == [False, False, True]
    assert not any(terminated for _, _, terminated, _, _ in results)
    env.reset(seed=0, options={"room": "######\n#P_XO#\n######"})
    assert not env.step("Left")[3], "reset restarts the step count"


def test_truncation_does_not_hide_a_solve_on_the_last_step():
    env, _ = room_env("#####\n#PXO#\n#####", max_steps=1)
    _, _, terminated, truncated, _ = env.step("Right")
    assert terminated and not truncated


@pytest.mark.parametrize(
    "room, message",
    [
        ("#####\n#PXO#\n####", "same length"),
        ("#####\n#PXO_\n#####", "enclosed"),
        ("######\n#PXOP#\n######", "exactly one player"),
        ("######\n#PXXO#\n######", "as many boxes as targets"),
        ("#####\n#P?O#\n#####", "unknown symbols"),
    ],
)
def test_bad_room_is_rejected(room, message):
    env = SokobanEnv(SokobanConfig())
    with pytest.raises(ValueError, match=message):
        env.reset(options={"room": room})


def test_unknown_reset_option_is_rejected():
    with pytest.raises(ValueError, match="level"):
        SokobanEnv(SokobanConfig()).reset(options={"level": 3})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": 8, "dim_x": 5, "dim_y": 5}, "num_boxes"),
        ({"dim_x": 4}, "dim_x"),
        ({"dim_y": 2}, "dim_y"),
        ({"max_steps": 0}, "max_steps"),
        ({"search_depth": 0}, "search_depth"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SokobanConfig(**kwargs)


def test_impossible_generation_raises_runtime_error():
    # 7 boxes fill 7 of the 9 interior cells: there is no room to get every box off a target.
    env = SokobanEnv(SokobanConfig(dim_x=5, dim_y=5, num_boxes=7))
    with pytest.raises(RuntimeError, match="could not generate"):
        env.reset(seed=0)
