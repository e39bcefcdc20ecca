import itertools
import re
from collections import Counter, deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ragen.envs import sokoban
from ragen.envs.sokoban import ACTIONS, SokobanConfig, SokobanEnv, parse_room, solve, solve_env
from ragen.envs.utils import TILE

INFO_KEYS = {"action_is_valid", "action_is_effective", "success"}
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def reference_solve(grid: str, max_moves: int = 200) -> list[str] | None:
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


def room_env(room: str, max_steps: int = 100, **config) -> tuple[SokobanEnv, str]:
    env = SokobanEnv(SokobanConfig(max_steps=max_steps, **config))
    obs, _ = env.reset(seed=0, options={"room": room})
    return env, obs


@pytest.mark.parametrize("render_mode", ["ansi", "rgb_array"])
def test_passes_gymnasium_check_env(render_mode):
    check_env(SokobanEnv(SokobanConfig(), render_mode=render_mode))


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

        solution = reference_solve(obs)
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


def test_push_from_target_onto_target_is_neither_reward_nor_penalty():
    env, _ = room_env("######\n#P√O_#\n#_X__#\n######")
    obs, reward, terminated, _, info = env.step("Right")
    assert obs == "######\n#_S√_#\n#_X__#\n######"
    assert reward == pytest.approx(-0.1) and not terminated and not info["success"]


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


@pytest.mark.parametrize("action", ["Jump", "", "   ", "up left", "U", "Up.", "<answer>Up</answer>", "上"])
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


def test_a_move_that_changes_nothing_costs_noop_reward():
    env, _ = room_env("######\n#P_XO#\n######", noop_reward=-1.0)
    assert env.step("Up")[1] == pytest.approx(-1.1)  # into the wall: the step and the no-op
    assert env.step("Right")[1] == pytest.approx(-0.1)  # a step
    assert env.step("Right")[1] == pytest.approx(10.9)  # the box home: no no-op cost
    env, _ = room_env("######\n#P_XO#\n######")
    assert env.step("Up")[1] == pytest.approx(-0.1)  # gym-sokoban's reward by default


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
        ({"search_depth": 2}, "search_depth"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SokobanConfig(**kwargs)


def test_impossible_generation_raises_runtime_error():
    # 7 boxes fill 7 of the 9 interior cells: there is no room to get every box off a target.
    env = SokobanEnv(SokobanConfig(dim_x=5, dim_y=5, num_boxes=7))
    with pytest.raises(RuntimeError, match="could not generate.*search_depth.*dim_x, dim_y.*num_boxes"):
        env.reset(seed=0)


def test_generation_retries_with_derived_generators_then_gives_up(monkeypatch):
    states = []

    def failing_attempt(config, rng):
        states.append(rng.bit_generator.state["state"]["state"])
        return None

    monkeypatch.setattr(sokoban, "_generation_attempt", failing_attempt)
    with pytest.raises(RuntimeError, match="could not generate"):
        SokobanEnv(SokobanConfig()).reset(seed=0)
    assert len(states) == sokoban.MAX_GENERATION_ATTEMPTS
    assert len(set(states)) == len(states), "every attempt runs on a generator of its own"


def test_oracle_solves_every_default_level_of_200_seeds():
    env = SokobanEnv(SokobanConfig())
    lengths = []
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        solution = solve_env(env)
        assert solution is not None, f"seed {seed} unsolved:\n{obs}"
        assert len(solution) >= sokoban.MIN_START_MOVES, f"seed {seed} is trivially easy:\n{obs}"
        rewards = [env.step(action)[1:4] for action in solution]
        assert [terminated for _, terminated, _ in rewards] == [False] * (len(solution) - 1) + [True]
        assert not any(truncated for *_, truncated in rewards)
        # The best one-box episode: one push onto the target (+1) and the solve (+10), -0.1 per move.
        assert sum(reward for reward, *_ in rewards) == pytest.approx(11.0 - 0.1 * len(solution))
        lengths.append(len(solution))
    assert np.median(lengths) >= 4, "levels should mostly need more than a few moves"


@pytest.mark.parametrize("dim, num_boxes, seeds", [(6, 1, 60), (7, 2, 30)])
def test_oracle_finds_solutions_as_short_as_the_reference(dim, num_boxes, seeds):
    env = SokobanEnv(SokobanConfig(dim_x=dim, dim_y=dim, num_boxes=num_boxes))
    for seed in range(seeds):
        obs, _ = env.reset(seed=seed)
        assert len(solve_env(env)) == len(reference_solve(obs)), f"seed {seed}:\n{obs}"


@pytest.mark.parametrize(
    "room, expected",
    [
        ("#####\n#PXO#\n#####", ["Right"]),
        ("#####\n#P√_#\n#####", []),  # already solved
        ("######\n#_XPO#\n#____#\n######", ["Down", "Left", "Left", "Up", "Right", "Right"]),
        ("######\n#X_PO#\n#____#\n######", None),  # box in a corner
        ("#######\n#_X__P#\n#_____#\n#__O__#\n#######", None),  # box stuck along the top wall
    ],
)
def test_oracle_hand_cases(room, expected):
    assert solve(*parse_room(room)) == expected


def test_oracle_gives_up_past_max_states():
    room = "#######\n#P____#\n#_X___#\n#____O#\n#######"
    assert len(solve(*parse_room(room))) == 7
    with pytest.raises(RuntimeError, match="more than 5 states"):
        solve(*parse_room(room), max_states=5)


def test_sample_action_is_uniform_valid_and_leaves_the_env_alone():
    env = SokobanEnv(SokobanConfig())
    env.reset(seed=0)
    before = env.np_random.bit_generator.state
    rng = np.random.default_rng(0)
    counts = Counter(env.sample_action(rng) for _ in range(4000))
    assert env.np_random.bit_generator.state == before
    assert set(counts) == {"Up", "Down", "Left", "Right"}
    assert all(900 < n < 1100 for n in counts.values())
    assert env.sample_action(np.random.default_rng(7)) == env.sample_action(np.random.default_rng(7))
    assert env.step(env.sample_action(rng))[4]["action_is_valid"]


ALL_SYMBOLS_ROOMS = ["#######\n#_O√XP#\n#######", "#######\n#_S√X_#\n#######"]  # every symbol appears


def test_rgb_array_draws_one_distinct_tile_per_symbol():
    env = SokobanEnv(SokobanConfig(), render_mode="rgb_array")
    obs, _ = env.reset(seed=3)
    assert isinstance(obs, str) and "\n" in obs, "the observation stays text"
    picture = env.render()
    assert picture.shape == (6 * TILE, 6 * TILE, 3) and picture.dtype == np.uint8

    tiles = {}
    for room in ALL_SYMBOLS_ROOMS:
        env.reset(options={"room": room})
        picture = env.render()
        assert picture.shape == (3 * TILE, 7 * TILE, 3)
        for col, symbol in enumerate(room.split("\n")[1]):
            tiles[symbol] = picture[TILE : 2 * TILE, col * TILE : (col + 1) * TILE]
    assert sorted(tiles) == sorted(sokoban.LEGEND)
    for (a, tile_a), (b, tile_b) in itertools.combinations(tiles.items(), 2):
        assert not np.array_equal(tile_a, tile_b), f"{a!r} and {b!r} look the same"


def test_rgb_array_follows_the_state():
    env = SokobanEnv(SokobanConfig(), render_mode="rgb_array")
    env.reset(options={"room": "#####\n#PXO#\n#####"})
    before = env.render()
    env.step("Right")
    after = env.render()
    changed_columns = {col // TILE for col in np.nonzero((before != after).any(axis=(0, 2)))[0]}
    assert changed_columns == {1, 2, 3}, "player, box and target cells change; walls do not"


def test_render_mode_is_checked():
    with pytest.raises(ValueError, match="render_mode"):
        SokobanEnv(SokobanConfig(), render_mode="human")


def test_custom_symbols_are_used_everywhere():
    config = SokobanConfig(symbols="W.tBbpq")  # wall, floor, target, box on target, box, player, player on target
    env = SokobanEnv(config)
    obs, _ = env.reset(seed=5)
    assert set(obs) <= set("W.tbpq\n") and obs.count("b") == 1
    assert env.observation_space.contains(obs)
    default_obs, _ = SokobanEnv(SokobanConfig()).reset(seed=5)
    assert obs == default_obs.translate(str.maketrans(sokoban.LEGEND, "W.tBbpq")), "only the symbols differ"
    assert "Legend: W wall, . floor, t target, b box, B box on target, p player, q player on target." in (
        env.instructions
    )
    assert "#" not in env.instructions.split("Legend:")[1]
    assert SokobanEnv.instructions != env.instructions

    obs, _ = env.reset(options={"room": "WWWWWW\nWpbt.W\nWWWWWW"})
    obs, reward, terminated, _, _ = env.step("Right")
    assert obs == "WWWWWW\nW.pB.W\nWWWWWW" and terminated and reward == pytest.approx(10.9)
    with pytest.raises(ValueError, match="unknown symbols"):
        env.reset(options={"room": "#####\n#PXO#\n#####"})
    check_env(env)


@pytest.mark.parametrize("symbols", ["#_O√XP", "#_O√XPSS", "#_O√XPP", "#_O√X S", "#_O√X\tS", "#_O√XP\n"])
def test_config_rejects_bad_symbols(symbols):
    with pytest.raises(ValueError, match="symbols"):
        SokobanConfig(symbols=symbols)


def test_default_instructions_carry_the_default_legend_and_actions():
    env = SokobanEnv(SokobanConfig())
    assert env.instructions == SokobanEnv.instructions
    assert "Legend: # wall, _ floor, O target, X box, √ box on target, P player, S player on target." in (
        env.instructions
    )
    assert "Actions: Up, Down, Left, Right." in env.instructions
    env.reset(seed=0)
    assert all(env.step(a)[4]["action_is_valid"] for a in env.example_actions)


def test_every_listed_choice_is_a_valid_move():
    # The state message lists the moves each turn (the untrained model names a move far more often with it)
    env = SokobanEnv(SokobanConfig())
    words = env.action_choices.replace(" or ", ", ").split(", ")
    assert sorted(words) == sorted(ACTIONS)
    for word in words:
        env.reset(seed=0)
        assert env.step(word)[4]["action_is_valid"]


def test_cell_separator_spaces_the_cells_and_changes_nothing_else():
    plain, spaced = SokobanEnv(SokobanConfig()), SokobanEnv(SokobanConfig(cell_separator=" "))
    plain_obs, _ = plain.reset(seed=3)
    spaced_obs, _ = spaced.reset(seed=3)
    assert spaced_obs == "\n".join(" ".join(row) for row in plain_obs.split("\n"))
    assert spaced.observation_space.contains(spaced_obs)
    for action in ["Up", "Left", "Down", "Right", "Right"]:
        plain_step, spaced_step = plain.step(action), spaced.step(action)
        assert spaced_step[0].replace(" ", "") == plain_step[0] and spaced_step[1:] == plain_step[1:]
    # a room given either way loads the same level
    spaced.reset(options={"room": spaced_obs})
    assert spaced.render() == spaced_obs
    assert parse_room(spaced_obs)[3] == parse_room(plain_obs)[3]


def test_config_rejects_a_bad_cell_separator():
    with pytest.raises(ValueError, match="cell_separator"):
        SokobanConfig(cell_separator="  ")


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_describe_names_the_rows_and_columns_of_the_text_state(num_boxes):
    env = SokobanEnv(SokobanConfig(dim_x=7, dim_y=7, num_boxes=num_boxes, cell_separator=" "))
    obs, _ = env.reset(seed=11)
    rows = [row.split(" ") for row in obs.split("\n")]

    def cells(*symbols):  # counted from 1 at the top left, as a reader of the text would
        return [f"row {r + 1}, column {c + 1}" for r, row in enumerate(rows) for c, s in enumerate(row) if s in symbols]

    text = env.describe()
    assert text.startswith(f"The player is at {cells('P', 'S')[0]}, ")
    boxes, targets = " and ".join(cells("X", "√")), " and ".join(cells("O", "√", "S"))
    if num_boxes == 1:
        assert text.endswith(f", the box at {boxes}, the target at {targets}.")
        env.reset(options={"room": "######\n#PXXO#\n#__O_#\n######"})  # the room's boxes count, not the config's
        assert "the boxes at row 2, column 3 and row 2, column 4," in env.describe()
    else:
        assert text.endswith(f", the boxes at {boxes}, the targets at {targets}.")


@pytest.mark.parametrize("observation_format", ["grid_coord", "coord"])
def test_describe_uses_the_coordinates_of_an_observation_that_has_them(observation_format):
    """Zero-indexed (row, col) like the observation's own lines, not the grid's rows counted from 1."""
    env = SokobanEnv(SokobanConfig(dim_x=7, dim_y=7, num_boxes=2, cell_separator=" ",
                                   observation_format=observation_format))
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        lines = dict(line.split(": ", 1) for line in obs.split("\n") if ": (" in line)
        player = lines.get("Player") or lines["Player on target"]
        boxes = sorted(re.findall(r"\(\d+, \d+\)", lines.get("Boxes", "") + lines.get("Boxes on target", "")))
        text = env.describe()
        assert text.startswith(f"The player is at {player}, the boxes at "), (text, obs)
        described = text.split("the boxes at ")[1].split(", the targets at ")[0]
        assert sorted(re.findall(r"\(\d+, \d+\)", described)) == boxes and len(boxes) == 2
        assert "row" not in text and "column" not in text
