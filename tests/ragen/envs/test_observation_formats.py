"""Observation formats of the grid envs (`observation_format`): "grid" as before, "grid_coord" and "coord" with
coordinate lines that must agree with the grid they are drawn beside."""

import hashlib
import re

import numpy as np
import pytest

from ragen.envs import check_env, check_env_config, make_env
from ragen.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv, oracle_action
from ragen.envs.sokoban import LEGEND, SokobanConfig, SokobanEnv, parse_room

HEADER = re.compile(r"Board size: (\d+) rows x (\d+) cols \(zero-indexed\)\.")
CELL = re.compile(r"\((\d+), (\d+)\)")
SOKOBAN_SYMBOLS = [LEGEND, "W.T*BAa"]
SEPARATORS = ["", " "]
FORMATS = ["grid", "grid_coord", "coord"]
NUM_LEVELS = 1000  # the coordinates' check (issue 31: >= 1,000 levels)
LINE_LEVELS = 200  # the extra lines' checks, in 12 and 8 variants: 1,200 observations a variant
RANDOM_STEPS = 5


def parse_observation(text: str, separator: str) -> tuple[tuple[int, int], dict[str, list], list[list[str]] | None]:
    """(board size, {label: cells as listed}, grid rows of cells or None), read back from the text alone."""
    header, *lines = text.split("\n")
    size = HEADER.fullmatch(header)
    assert size, f"bad header {header!r}"
    coordinates, grid = {}, None
    for i, line in enumerate(lines):
        if line == "Grid:":
            grid = [row.split(" ") if separator else list(row) for row in lines[i + 1:]]
            break
        label, cells_text = line.split(": ")
        cells = [(int(r), int(c)) for r, c in CELL.findall(cells_text)]
        assert cells and cells_text == ", ".join(f"({r}, {c})" for r, c in cells), f"bad line {line!r}"
        assert cells == sorted(cells), f"{label} not in row-major order: {line!r}"
        assert label not in coordinates, f"{label} listed twice"
        coordinates[label] = cells
    if grid is not None:
        assert all(len(cell) == 1 for row in grid for cell in row), "a cell is one symbol"
        assert (len(grid), len(grid[0])) == (int(size[1]), int(size[2])) and len({len(row) for row in grid}) == 1
    return (int(size[1]), int(size[2])), coordinates, grid


def cells_of(grid: list[list[str]], symbols: str) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(grid) for c, s in enumerate(row) if s in symbols]


def transcript_hash(env, seeds=range(30), steps=8) -> str:
    """A digest of the instructions and the observations of a few seeded random episodes."""
    digest = hashlib.sha256()
    for seed in seeds:
        rng = np.random.default_rng(seed)
        digest.update(env.reset(seed=seed)[0].encode())
        for _ in range(steps):
            digest.update(env.step(env.sample_action(rng))[0].encode())
    digest.update(env.instructions.encode())
    return digest.hexdigest()[:16]


def play(env, num_levels: int, steps: int = RANDOM_STEPS):
    """Every observation of `num_levels` seeded levels: after reset and after each of `steps` random actions."""
    rng = np.random.default_rng(0)
    for seed in range(num_levels):
        yield env.reset(seed=seed)[0]
        for _ in range(steps):
            obs, _, terminated, truncated, _ = env.step(env.sample_action(rng))
            yield obs
            if terminated or truncated:
                break


# ---- "grid" stays as it was ----------------------------------------------------------------------------------
# Recorded with `transcript_hash` before the observation formats existed.
GRID_TRANSCRIPTS = {
    ("sokoban", LEGEND, ""): "0efd26c13bb8cd75",
    ("sokoban", LEGEND, " "): "076743f2b7a56882",
    ("sokoban", "W.T*BAa", ""): "2fce9a76fb74a2f3",
    ("sokoban", "W.T*BAa", " "): "9b349263846ba732",
    ("frozen_lake", None, ""): "a87bb564ac102b7e",
    ("frozen_lake", None, " "): "2ef54a14e9945620",
}


@pytest.mark.parametrize("env_type, symbols, separator", list(GRID_TRANSCRIPTS))
def test_grid_format_is_unchanged(env_type, symbols, separator):
    config = {"cell_separator": separator} | ({"symbols": symbols} if symbols else {})
    assert transcript_hash(make_env(env_type, config)) == GRID_TRANSCRIPTS[env_type, symbols, separator]
    assert make_env(env_type, config).config.observation_format == "grid", "the default"


def test_grid_format_start_states_as_before():
    assert SokobanEnv(SokobanConfig()).reset(seed=42)[0] == "######\n##_###\n#____#\n#__#X#\n#P_#O#\n######"
    assert FrozenLakeEnv(FrozenLakeConfig(cell_separator=" ")).reset(seed=42)[0] == (
        "P _ O _\n_ _ _ _\n_ _ _ _\n_ _ _ G")


# ---- the exact layouts -------------------------------------------------------------------------------------
def test_sokoban_grid_coord_example():
    env = SokobanEnv(SokobanConfig(observation_format="grid_coord", cell_separator=" "))
    assert env.reset(seed=42)[0] == (
        "Board size: 6 rows x 6 cols (zero-indexed).\n"
        "Targets: (4, 4)\n"
        "Boxes: (3, 4)\n"
        "Player: (4, 1)\n"
        "Grid:\n"
        "# # # # # #\n# # _ # # #\n# _ _ _ _ #\n# _ _ # X #\n# P _ # O #\n# # # # # #"
    )


def test_sokoban_coord_example_lists_the_inner_walls_instead_of_the_grid():
    env = SokobanEnv(SokobanConfig(observation_format="coord"))
    assert env.reset(seed=42)[0] == (
        "Board size: 6 rows x 6 cols (zero-indexed).\n"
        "Inner walls: (1, 1), (1, 3), (1, 4), (3, 3), (4, 3)\n"
        "Targets: (4, 4)\n"
        "Boxes: (3, 4)\n"
        "Player: (4, 1)"
    )


def test_sokoban_boxes_and_player_on_targets_get_their_own_lines_and_empty_lines_are_left_out():
    room = "#######\n#S√_X_#\n###_###\n#######"
    env = SokobanEnv(SokobanConfig(observation_format="grid_coord"))
    assert env.reset(options={"room": room})[0] == (
        "Board size: 4 rows x 7 cols (zero-indexed).\n"
        "Boxes: (1, 4)\n"
        "Boxes on target: (1, 2)\n"
        "Player on target: (1, 1)\n"
        "Grid:\n" + room
    )
    coord = SokobanEnv(SokobanConfig(observation_format="coord"))
    assert coord.reset(options={"room": room})[0] == (
        "Board size: 4 rows x 7 cols (zero-indexed).\n"
        "Inner walls: (2, 1), (2, 2), (2, 4), (2, 5)\n"
        "Boxes: (1, 4)\n"
        "Boxes on target: (1, 2)\n"
        "Player on target: (1, 1)"
    )
    obs = env.step("Right")[0]  # pushes the box off its target: the player now stands on that one
    assert obs.split("\nGrid:\n")[0].split("\n")[1:] == [
        "Targets: (1, 1)", "Boxes: (1, 3), (1, 4)", "Player on target: (1, 2)"]


def test_frozen_lake_examples_and_a_player_in_a_hole():
    env = FrozenLakeEnv(FrozenLakeConfig(observation_format="grid_coord", cell_separator=" "))
    assert env.reset(seed=42)[0] == (
        "Board size: 4 rows x 4 cols (zero-indexed).\n"
        "Start: (0, 0)\n"
        "Goal: (3, 3)\n"
        "Player: (0, 0)\n"
        "Holes: (0, 2)\n"
        "Grid:\n"
        "P _ O _\n_ _ _ _\n_ _ _ _\n_ _ _ G"
    )
    coord = FrozenLakeEnv(FrozenLakeConfig(observation_format="coord", is_slippery=False))
    coord.reset(options={"map": ["SFF", "FHF", "FFG"]})
    obs, _, terminated, _, _ = coord.step("Down")
    obs, _, terminated, _, _ = coord.step("Right")
    assert terminated and obs == (
        "Board size: 3 rows x 3 cols (zero-indexed).\n"
        "Start: (0, 0)\n"
        "Goal: (2, 2)\n"
        "Player: (1, 1)\n"
        "Holes: (1, 1)"
    )
    assert "Holes" not in coord.reset(options={"map": ["SF", "FG"]})[0], "no holes, no line"


# ---- the coordinates agree with the grid, over many levels ----------------------------------------------------
@pytest.mark.parametrize(
    "symbols, separator, num_boxes, num_levels",
    [(symbols, separator, 1, NUM_LEVELS) for symbols in SOKOBAN_SYMBOLS for separator in SEPARATORS]
    + [(LEGEND, " ", 2, 300)],  # several cells on a line
)
def test_sokoban_coordinates_agree_with_the_grid(symbols, separator, num_boxes, num_levels):
    wall, floor, target, box_on_target, box, player, player_on_target = symbols
    size = 6 + num_boxes - 1
    env = SokobanEnv(SokobanConfig(dim_x=size, dim_y=size, num_boxes=num_boxes, symbols=symbols,
                                   cell_separator=separator, observation_format="grid_coord"))
    labels = {"Targets": target, "Boxes": box, "Boxes on target": box_on_target, "Player": player,
              "Player on target": player_on_target}
    seen = set()
    for obs in play(env, num_levels):
        assert env.observation_space.contains(obs)
        size, coordinates, grid = parse_observation(obs, separator)
        assert size == env.walls.shape and set(coordinates) <= set(labels)
        for label, symbol in labels.items():
            assert coordinates.get(label, []) == cells_of(grid, symbol), f"{label} disagrees with the grid:\n{obs}"
        assert len(coordinates.get("Player", []) + coordinates.get("Player on target", [])) == 1
        seen.update(coordinates)
    assert seen == set(labels), "every line was seen at least once"


@pytest.mark.parametrize("symbols, separator, observation_format",
                         [(symbols, separator, fmt) for symbols in SOKOBAN_SYMBOLS for separator in SEPARATORS
                          for fmt in FORMATS])
def test_sokoban_neighbours_line_names_the_cells_around_the_player(symbols, separator, observation_format):
    """`neighbours`: the last line names the four cells next to the player as the grid (or, for "coord", the grid
    of the same level) shows them; the observation without it is the one of `neighbours` false, byte for byte."""
    wall, floor, target, box_on_target, box, player, player_on_target = symbols
    words = {wall: "wall", floor: "floor", target: "target", box: "box", box_on_target: "box on target"}
    config = dict(symbols=symbols, cell_separator=separator, observation_format=observation_format)
    env, plain = SokobanEnv(SokobanConfig(neighbours=True, **config)), SokobanEnv(SokobanConfig(**config))
    drawn = SokobanEnv(SokobanConfig(symbols=symbols))  # the grid alone, for "coord", which has none
    seen = set()
    for obs, plain_obs, grid_obs in zip(play(env, LINE_LEVELS), play(plain, LINE_LEVELS), play(drawn, LINE_LEVELS),
                                        strict=True):
        assert env.observation_space.contains(obs)
        text, line = obs.rsplit("\n", 1)
        assert text == plain_obs
        grid = [list(row) for row in grid_obs.split("\n")]
        (r, c), = cells_of(grid, player + player_on_target)
        expected = [f"{name} {words[grid[r + dr][c + dc]]}"
                    for name, (dr, dc) in {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}.items()]
        assert line == "Around the player: " + ", ".join(expected), f"{line!r} disagrees with the grid:\n{grid_obs}"
        seen.update(expected)
    assert {w.split(" ", 1)[1] for w in seen} == set(words.values()), "every kind of cell was seen"


@pytest.mark.parametrize("symbols, separator, observation_format",
                         [(symbols, separator, fmt) for symbols in SOKOBAN_SYMBOLS for separator in SEPARATORS
                          for fmt in ("grid", "grid_coord")])
def test_sokoban_columns_are_the_grid_transposed(symbols, separator, observation_format):
    """`columns`: after the observation of `columns` false, byte for byte, the label and one line per column of its
    grid, top to bottom, with the neighbours line (if any) still last."""
    config = dict(symbols=symbols, cell_separator=separator, observation_format=observation_format)
    env = SokobanEnv(SokobanConfig(columns=True, neighbours=True, **config))
    plain = SokobanEnv(SokobanConfig(neighbours=True, **config))
    for obs, plain_obs in zip(play(env, LINE_LEVELS), play(plain, LINE_LEVELS), strict=True):
        assert env.observation_space.contains(obs)
        text, line = plain_obs.rsplit("\n", 1)
        rows = text.split("\n")[-env.config.dim_y:]  # the grid: the last lines before the neighbours line
        cells = [row.split(separator) if separator else list(row) for row in rows]
        columns = [separator.join(column) for column in zip(*cells)]
        assert obs == "\n".join([text, "Columns (top to bottom):", *columns, line])


def test_sokoban_columns_need_a_grid():
    with pytest.raises(ValueError, match="shows no grid"):
        SokobanConfig(observation_format="coord", columns=True)


def test_sokoban_coord_is_grid_coord_without_the_grid_plus_the_inner_walls():
    with_grid = SokobanEnv(SokobanConfig(observation_format="grid_coord"))
    alone = SokobanEnv(SokobanConfig(observation_format="coord"))
    for obs, coord_obs in zip(play(with_grid, 200), play(alone, 200), strict=True):
        assert alone.observation_space.contains(coord_obs)
        _, coordinates, grid = parse_observation(obs, "")
        _, coord_coordinates, no_grid = parse_observation(coord_obs, "")
        inner_walls = [(r, c) for r, c in cells_of(grid, "#") if 0 < r < len(grid) - 1 and 0 < c < len(grid[0]) - 1]
        assert no_grid is None and coord_coordinates == {"Inner walls": inner_walls} | coordinates
        assert list(coord_coordinates) == ["Inner walls", *coordinates], "same order, walls first"


@pytest.mark.parametrize("separator", SEPARATORS)
def test_frozen_lake_coordinates_agree_with_the_grid(separator):
    env = FrozenLakeEnv(FrozenLakeConfig(cell_separator=separator, observation_format="grid_coord"))
    alone = FrozenLakeEnv(FrozenLakeConfig(cell_separator=separator, observation_format="coord"))
    rng = np.random.default_rng(0)
    for seed in range(NUM_LEVELS):
        obs, start = env.reset(seed=seed)[0], None
        assert alone.reset(seed=seed)[0] == obs.split("\nGrid:\n")[0]
        for step in range(RANDOM_STEPS + 1):
            assert env.observation_space.contains(obs)
            size, coordinates, grid = parse_observation(obs, separator)
            assert size == env.desc.shape and list(coordinates) == ["Start", "Goal", "Player", "Holes"][
                :4 if "Holes" in coordinates else 3]
            assert coordinates["Player"] == cells_of(grid, "PX√")
            assert coordinates["Goal"] == cells_of(grid, "G√")
            assert coordinates.get("Holes", []) == cells_of(grid, "OX")
            start = start or coordinates["Player"]  # the player starts on the start
            assert coordinates["Start"] == start and grid[start[0][0]][start[0][1]] in "_P"  # not marked in the grid
            if step == RANDOM_STEPS:
                break
            action = env.sample_action(rng)
            obs, _, terminated, truncated, _ = env.step(action)
            assert alone.step(action)[0] == obs.split("\nGrid:\n")[0], "the same slips, the same text"
            if terminated or truncated:
                break


@pytest.mark.parametrize("separator", SEPARATORS)
def test_frozen_lake_player_on_the_goal_is_listed_as_player_and_goal(separator):
    """Random steps rarely reach the goal: the oracle walks there on dry maps, and the last state is checked."""
    env = FrozenLakeEnv(FrozenLakeConfig(cell_separator=separator, observation_format="grid_coord", is_slippery=False))
    reached = 0
    for seed in range(100):
        obs = env.reset(seed=seed)[0]
        for _ in range(env.desc.size):
            obs, reward, terminated, _, info = env.step(oracle_action(env))
            if terminated:
                break
        if not info["success"]:
            continue
        reached += 1
        _, coordinates, grid = parse_observation(obs, separator)
        assert coordinates["Player"] == coordinates["Goal"] == cells_of(grid, "√")
        assert cells_of(grid, "PG") == []
    assert reached >= 50, "the oracle reaches the goal of most dry maps"


# ---- config, instructions, spaces ---------------------------------------------------------------------------
@pytest.mark.parametrize("config_cls", [SokobanConfig, FrozenLakeConfig])
def test_config_rejects_an_unknown_observation_format_naming_the_allowed_ones(config_cls):
    with pytest.raises(ValueError, match=r"observation_format='coords' must be one of 'grid', 'grid_coord', 'coord'"):
        config_cls(observation_format="coords")


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake"])
def test_env_config_checks_the_observation_format(env_type):
    with pytest.raises(ValueError, match="observation_format"):
        check_env_config(env_type, {"observation_format": "image"})
    with pytest.raises(ValueError, match="observation_format"):
        check_env_config(env_type, {"observation_format": 1})
    check_env_config(env_type, {"observation_format": "coord"})


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake"])
def test_instructions_explain_coordinates_only_in_the_coordinate_formats(env_type):
    grid, grid_coord, coord = (make_env(env_type, {"observation_format": f}).instructions for f in FORMATS)
    note = "Coordinates are zero-indexed (row, column) counted from the top-left corner"
    assert note not in grid and note in grid_coord and note in coord
    assert "Legend:" in grid_coord and "Legend:" not in coord, "coord shows no symbols"
    assert grid_coord.replace(grid_coord.split("\n")[2] + "\n", "") == grid, "grid_coord adds one line"


def test_sokoban_coord_instructions_say_the_border_is_wall():
    assert "border of the board is wall" in SokobanEnv(SokobanConfig(observation_format="coord")).instructions


@pytest.mark.parametrize("observation_format", FORMATS)
@pytest.mark.parametrize("separator", SEPARATORS)
def test_every_format_passes_check_env(observation_format, separator):
    check_env(SokobanEnv(SokobanConfig(observation_format=observation_format, cell_separator=separator)))
    check_env(FrozenLakeEnv(FrozenLakeConfig(observation_format=observation_format, cell_separator=separator)))
    check_env(SokobanEnv(SokobanConfig(symbols="W.T*BAa", observation_format=observation_format)))


def test_a_grid_coord_observation_loads_as_a_room():
    env = SokobanEnv(SokobanConfig(symbols="W.T*BAa", observation_format="grid_coord", cell_separator=" "))
    obs = env.reset(seed=7)[0]
    assert env.reset(options={"room": obs})[0] == obs
    assert parse_room(obs, "W.T*BAa")[3] == env.player


def test_a_loaded_room_of_another_size_fits_the_space():
    env = SokobanEnv(SokobanConfig(observation_format="grid_coord", cell_separator=" "))
    room = "\n".join(["#" * 12] + ["#" + "_" * 10 + "#"] * 9 + ["#" * 12])
    room = room[:14] + "PXO" + room[17:]
    obs = env.reset(options={"room": room})[0]
    assert obs.startswith("Board size: 11 rows x 12 cols") and "Targets: (1, 3)" in obs
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake"])
@pytest.mark.parametrize("image_observation", ["alone", "with_text"])
@pytest.mark.parametrize("observation_format", ["grid", "grid_coord", "coord"])
def test_image_observations_show_the_rgb_render_where_the_placeholder_stands(env_type, image_observation,
                                                                             observation_format):
    config = {"observation_format": observation_format, "cell_separator": " "}
    env = make_env(env_type, config | {"image_observation": image_observation})
    check_env(env)
    text_env = make_env(env_type, config)
    picture_env = type(text_env)(text_env.config, render_mode="rgb_array")
    observation, info = env.reset(seed=7)
    text, _ = text_env.reset(seed=7)
    picture_env.reset(seed=7)
    for action in ["Down", "Right", "nonsense", "Up"]:  # the picture follows every step, invalid ones too
        expected = "<image>" if image_observation == "alone" else f"<image>\n{text}"
        assert observation == expected
        (image,) = info["images"]
        assert image.dtype == np.uint8 and np.array_equal(image, picture_env.render())
        observation, _, _, _, info = env.step(action)
        text = text_env.step(action)[0]
        picture_env.step(action)
    assert "picture" in env.instructions and ("Legend" in env.instructions) == (
        image_observation == "with_text" and observation_format != "coord")


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake"])
def test_text_observations_carry_no_pictures_and_a_bad_image_mode_is_named(env_type):
    _, info = make_env(env_type, {}).reset(seed=0)
    assert "images" not in info
    with pytest.raises(ValueError, match="image_observation='pixels' must be one of 'none', 'alone', 'with_text'"):
        check_env_config(env_type, {"image_observation": "pixels"})


def test_every_engine_takes_pictures():
    from ragen.config import validate
    from ragen.overrides import load_config

    pictures = ["+custom_envs.CoordSokoban.env_config.image_observation=alone"]
    for engine in ("torch", "hf", "vllm"):  # RLOO, and with a critic, which reads the pictures too
        validate(load_config("sokoban", [*pictures, f"actor_rollout_ref.rollout.name={engine}"]), world_size=1)
        validate(load_config("sokoban", [*pictures, f"actor_rollout_ref.rollout.name={engine}", "algo=starpo_s",
                                         "actor_rollout_ref.rollout.rollout_filter_value=1"]), world_size=1)
