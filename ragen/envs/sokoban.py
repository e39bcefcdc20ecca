"""Sokoban: push every box onto a target in a small walled room.

Levels are generated backwards, so that every level is solvable without running a solver:
  1. carve a room: a random walk inside the wall border turns walls into floor;
  2. put the boxes on targets (the solved state) and the player on a free floor cell;
  3. play in reverse for `search_depth` random moves, where the player either steps or pulls a box it
     stands next to (steps away from it and the box follows); a pull is the exact undo of a push.
The start state is the visited state, with every box off a target, that needs the most moves by a cheap
lower bound (`moves_lower_bound`): the pushes that bring each box to its nearest target plus the player's
walk to the nearest box. Undoing the reverse moves one by one solves the level, so a solution always
exists. An attempt whose best state needs fewer than MIN_START_MOVES moves (too easy: without this rule a
fifth of the 6x6 levels were solved in one or two moves) is retried with a generator derived from the
env's, at most MAX_GENERATION_ATTEMPTS times; then generation fails with a RuntimeError.

Rewards follow gym-sokoban: -0.1 per step, +1 for pushing a box onto a target, -1 for pushing one off,
+10 when every box is on a target; the best one-box episode of n moves scores 10.9 - 0.1 * (n - 1).

`solve` is the oracle: a breadth-first search for a shortest solution.

Observation formats (`SokobanConfig.observation_format`, see utils.check_observation_format): "grid" is the grid
alone; "grid_coord" writes the board size and coordinates above it, RAGEN-2's observation:
    Board size: 6 rows x 6 cols (zero-indexed).
    Targets: (4, 4)
    Boxes: (3, 4)
    Player: (4, 1)
    Grid:
    ######
    ...
Each coordinate line lists the cells of one grid symbol, 0-based (row, col) with the wall border counted, in
row-major order: Targets (empty targets, O), Boxes (off target, X), Boxes on target (√), then Player (P) or
Player on target (S). A symbol not on the board has no line, so the lines never disagree with the grid and
their union places every object. "coord" writes the same lines without the grid, after an `Inner walls` line
(the walls inside the border; the border is always wall and the instructions say so).

`SokobanConfig.neighbours` adds a last line naming the four cells next to the player in words, in every format:
    Around the player: Up wall, Down box, Left floor, Right target
(wall, floor, target, box, box on target). The grid holds the same facts, but a model must find the cell one row
below the player several tokens further on; the line spells out the cells that decide whether a move does anything.

`SokobanConfig.columns` (formats with a grid) writes the grid again after it, transposed: one line per column,
column 0 first, each from row 0 down, under `Columns (top to bottom):`. In the grid the cells above and below the
player sit a row's worth of tokens away from it; in its column's line they are its neighbours, as the cells to its
left and right are in its row.
"""

from collections import deque
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

from ragen.envs.utils import (
    COORDINATES_NOTE, check_cell_separator, check_image_observation, check_observation_format, choices_text,
    grid_space, grid_text, grid_to_rgb, image_space, observation_text, shortest_path, step_info, tile, with_image,
)

ACTIONS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}  # (row, column) offsets
ACTION_BY_WORD = {word.lower(): word for word in ACTIONS}  # actions match ignoring case
DIRECTIONS = list(ACTIONS.values())
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0

# Default symbols of the text state; SokobanConfig.symbols lists its own in this order.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "√", "X", "P", "S"
LEGEND = WALL + FLOOR + TARGET + BOX_ON_TARGET + BOX + PLAYER + PLAYER_ON_TARGET
# the labels of the coordinate lines, in the order written ("Inner walls" in the "coord" format only)
COORDINATE_LABELS = ("Inner walls", "Targets", "Boxes", "Boxes on target", "Player", "Player on target")

# rgb_array colours
WALL_RGB, FLOOR_RGB = (70, 70, 80), (225, 215, 190)
TARGET_RGB, BOX_RGB, BOX_ON_TARGET_RGB, PLAYER_RGB = (210, 40, 40), (170, 100, 30), (40, 160, 60), (40, 80, 220)

FLOOR_FRACTION = 0.7  # share of the room's interior that the random walk turns into floor
TURN_PROB = 0.2  # chance per carving step that the walk changes direction
PULL_PROB = 0.8  # chance of pulling rather than stepping when next to a box: short walks move boxes farther
MIN_START_MOVES = 3  # a start state must need at least this many moves (by moves_lower_bound); else retry
MAX_GENERATION_ATTEMPTS = 1000  # rooms tried before giving up; a 6x6 one-box level takes 2.2 on average
MAX_SOLVER_STATES = 1_000_000  # states `solve` visits before giving up with a RuntimeError

Cell = tuple[int, int]
Level = tuple[np.ndarray, np.ndarray, np.ndarray, Cell]  # (walls, targets, boxes) boolean (H, W) grids, player


@dataclass
class SokobanConfig:
    dim_x: int = 6  # room width in cells, wall border included
    dim_y: int = 6  # room height in cells, wall border included
    num_boxes: int = 1  # boxes (and targets) per room
    max_steps: int = 100  # valid actions before the episode is truncated
    search_depth: int = 30  # random reverse moves played from the solved state to make a level
    # added to the reward of a move that changes nothing (into a wall, or a box against a wall or box): 0 as in
    # gym-sokoban; negative makes a policy that repeats such a move (a loop, with one state shown) pay for each
    noop_reward: float = 0.0
    # text symbols for: wall, floor, target, box on target, box, player, player on target
    symbols: str = LEGEND
    cell_separator: str = ""  # between the cells of a row: "" or " " (see check_cell_separator)
    observation_format: str = "grid"  # "grid", "grid_coord" or "coord" (see the module docstring)
    image_observation: str = "none"  # "none", "alone" (a picture instead of the text) or "with_text" (utils)
    neighbours: bool = False  # a last line names the four cells next to the player (the module docstring)
    columns: bool = False  # the grid's columns follow it as lines, top to bottom (the module docstring)

    def __post_init__(self) -> None:
        for name in ("dim_x", "dim_y"):
            if getattr(self, name) < 5:
                value = getattr(self, name)
                raise ValueError(f"{name}={value} must be >= 5: a wall border around at least 3 floor cells")
        interior = (self.dim_x - 2) * (self.dim_y - 2)
        if not 1 <= self.num_boxes <= interior - 2:
            raise ValueError(
                f"num_boxes={self.num_boxes} must be between 1 and {interior - 2} for a {self.dim_x}x{self.dim_y} "
                "room (the player and one free cell must fit): change num_boxes or enlarge the room"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        if self.search_depth < MIN_START_MOVES:
            raise ValueError(f"search_depth={self.search_depth} must be >= {MIN_START_MOVES}: a start state needs at "
                             f"least {MIN_START_MOVES} moves, so fewer reverse moves can never make a level")
        if len(self.symbols) != 7 or len(set(self.symbols)) != 7 or any(ch.isspace() for ch in self.symbols):
            raise ValueError(
                f"symbols={self.symbols!r} must be 7 distinct non-whitespace characters for wall, floor, target, "
                f"box on target, box, player and player on target, in that order (the default is {LEGEND!r})"
            )
        check_cell_separator(self.cell_separator)
        check_observation_format(self.observation_format)
        check_image_observation(self.image_observation)
        if self.columns and self.observation_format == "coord":
            raise ValueError("columns=true lists the grid's columns, and observation_format='coord' shows no grid: "
                             "use 'grid' or 'grid_coord', or columns=false")


def carve_room(height: int, width: int, num_floor: int, rng: np.random.Generator) -> np.ndarray:
    """Walls everywhere, then a random walk inside the border frees `num_floor` cells. Returns walls (H, W)."""
    walls = np.ones((height, width), dtype=bool)
    row, col = int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1))
    walls[row, col] = False
    carved = 1
    direction = DIRECTIONS[rng.integers(4)]
    while carved < num_floor:
        if rng.random() < TURN_PROB:
            direction = DIRECTIONS[rng.integers(4)]
        next_row, next_col = row + direction[0], col + direction[1]
        if not (0 < next_row < height - 1 and 0 < next_col < width - 1):
            direction = DIRECTIONS[rng.integers(4)]
            continue
        row, col = next_row, next_col
        carved += int(walls[row, col])
        walls[row, col] = False
    return walls


def push_distances(walls: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per cell, the fewest pushes that bring a box from there onto some target, other boxes ignored.

    -1 marks a dead cell, from which no pushes reach a target (a corner, a wall side with no target on it):
    a box there makes the level unsolvable. Walks backwards from the targets: a box pushed one cell in
    direction d came from the cell before, and the player stood one cell further back. (H, W) int array.
    """
    distances = np.full(walls.shape, -1)
    distances[targets] = 0
    frontier = deque(tuple(cell) for cell in np.argwhere(targets).tolist())
    while frontier:
        row, col = frontier.popleft()
        for d_row, d_col in DIRECTIONS:
            before = (row - d_row, col - d_col)
            pusher = (before[0] - d_row, before[1] - d_col)
            if not walls[before] and not walls[pusher] and distances[before] < 0:
                distances[before] = distances[row, col] + 1
                frontier.append(before)
    return distances


def moves_lower_bound(walls: np.ndarray, pushes: np.ndarray, boxes: list[Cell], player: Cell) -> int:
    """A lower bound on the moves that solve the state.

    Every box needs its pushes to the nearest target (`pushes`, from `push_distances`), and before the first
    push the player walks, around the boxes, to a cell next to one.
    """
    box_set = set(boxes)
    seen, frontier = {player}, deque([(player, 0)])
    while frontier:
        (row, col), walk = frontier.popleft()
        neighbours = [(row + d_row, col + d_col) for d_row, d_col in DIRECTIONS]
        if box_set.intersection(neighbours):
            return int(sum(pushes[box] for box in boxes)) + walk
        for cell in neighbours:
            if not walls[cell] and cell not in box_set and cell not in seen:
                seen.add(cell)
                frontier.append((cell, walk + 1))
    raise AssertionError("reverse play keeps the player in reach of the boxes it pulled")


def reverse_play(
    walls: np.ndarray, targets: list[Cell], player: Cell, search_depth: int, rng: np.random.Generator
) -> tuple[list[Cell], Cell] | None:
    """Random reverse moves from the solved state; return (boxes, player) of the hardest-looking state.

    "Hardest-looking" is the visited state, with every box off a target, of the largest `moves_lower_bound`;
    ties go to the latest. None when no such state has a bound of at least MIN_START_MOVES.
    """
    pushes = push_distances(walls, _cells_to_grid(targets, walls.shape))
    boxes = list(targets)
    best, best_bound = None, MIN_START_MOVES
    for _ in range(search_depth):
        steps, pulls = [], []
        for d_row, d_col in DIRECTIONS:
            ahead, behind = (player[0] + d_row, player[1] + d_col), (player[0] - d_row, player[1] - d_col)
            if walls[ahead] or ahead in boxes:
                continue
            steps.append((d_row, d_col))
            if behind in boxes:
                pulls.append((d_row, d_col))
        if not steps:
            return best
        if pulls and rng.random() < PULL_PROB:
            d_row, d_col = pulls[rng.integers(len(pulls))]
            boxes[boxes.index((player[0] - d_row, player[1] - d_col))] = player
        else:
            d_row, d_col = steps[rng.integers(len(steps))]
        player = (player[0] + d_row, player[1] + d_col)

        if set(boxes) & set(targets):
            continue
        bound = moves_lower_bound(walls, pushes, boxes, player)
        if bound >= best_bound:
            best, best_bound = (list(boxes), player), bound
    return best


def _generation_attempt(config: SokobanConfig, rng: np.random.Generator) -> Level | None:
    interior = (config.dim_x - 2) * (config.dim_y - 2)
    num_floor = max(round(FLOOR_FRACTION * interior), config.num_boxes + 2)
    walls = carve_room(config.dim_y, config.dim_x, num_floor, rng)
    floor = [tuple(cell) for cell in np.argwhere(~walls).tolist()]
    picked = rng.choice(len(floor), config.num_boxes + 1, replace=False)
    targets, player = [floor[i] for i in picked[:-1]], floor[picked[-1]]
    result = reverse_play(walls, targets, player, config.search_depth, rng)
    if result is None:
        return None
    boxes, player = result
    return walls, _cells_to_grid(targets, walls.shape), _cells_to_grid(boxes, walls.shape), player


def generate_level(config: SokobanConfig, rng: np.random.Generator) -> Level:
    """A solvable level. Draws one seed from `rng`; attempt k runs on a generator seeded with (seed, k)."""
    base_seed = int(rng.integers(2**63))
    for attempt in range(MAX_GENERATION_ATTEMPTS):
        level = _generation_attempt(config, np.random.default_rng([base_seed, attempt]))
        if level is not None:
            return level
    raise RuntimeError(
        f"could not generate a {config.dim_x}x{config.dim_y} Sokoban level with {config.num_boxes} box(es) off "
        f"their targets and at least {MIN_START_MOVES} moves to solve in {MAX_GENERATION_ATTEMPTS} attempts: "
        "increase search_depth or the room size (dim_x, dim_y), or lower num_boxes"
    )


def _cells_to_grid(cells: list[Cell], shape: tuple[int, int]) -> np.ndarray:
    grid = np.zeros(shape, dtype=bool)
    grid[tuple(np.array(cells).T)] = True
    return grid


def solve(
    walls: np.ndarray, targets: np.ndarray, boxes: np.ndarray, player: Cell, max_states: int = MAX_SOLVER_STATES
) -> list[str] | None:
    """A shortest action sequence (words of ACTIONS) that puts every box on a target; None if there is none.

    Breadth-first search over (player, boxes) states, cells numbered and the boxes held as a bitmask; states
    with a box on a dead cell (see `push_distances`) are never entered. `walls`, `targets`, `boxes` are
    (H, W) boolean grids of an enclosed room. Raises RuntimeError after visiting `max_states` states.
    """
    assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all(), "room not enclosed"
    cells = [tuple(cell) for cell in np.argwhere(~walls).tolist()]
    index = {cell: i for i, cell in enumerate(cells)}
    # neighbours[i][k]: the cell one step from cell i in direction k, or -1 for a wall
    neighbours = [[index.get((row + d_row, col + d_col), -1) for d_row, d_col in DIRECTIONS] for row, col in cells]
    pushes = push_distances(walls, targets)
    dead = sum(1 << i for i, cell in enumerate(cells) if pushes[cell] < 0)
    goal = sum(1 << index[cell] for cell in map(tuple, np.argwhere(targets).tolist()))
    start_boxes = sum(1 << index[cell] for cell in map(tuple, np.argwhere(boxes).tolist()))
    if start_boxes & dead:
        return None  # a target cell is never dead, so a box on a dead cell can never reach one
    words = list(ACTIONS)

    def successors(state: tuple[int, int]):
        player_i, box_mask = state
        for k, step in enumerate(neighbours[player_i]):
            if step < 0:
                continue
            if not box_mask >> step & 1:
                yield words[k], (step, box_mask)
                continue
            beyond = neighbours[step][k]
            if beyond >= 0 and not (box_mask | dead) >> beyond & 1:
                yield words[k], (step, box_mask ^ (1 << step) ^ (1 << beyond))

    return shortest_path((index[player], start_boxes), successors, lambda state: state[1] == goal, max_states)


def solve_env(env: "SokobanEnv", max_states: int = MAX_SOLVER_STATES) -> list[str] | None:
    """`solve` from the environment's current state."""
    return solve(env.walls, env.targets, env.boxes, env.player, max_states)


def parse_room(text: str, symbols: str = LEGEND) -> Level:
    """Read a room written with `symbols` (see SokobanConfig) into (walls, targets, boxes) and the player.

    The cells of a row may be space-separated; of a "grid_coord" observation only the grid after "Grid:" is read.
    """
    wall, _, target, box_on_target, box, player, player_on_target = symbols
    lines = text.strip("\n").split("\n")
    if "Grid:" in lines:
        lines = lines[lines.index("Grid:") + 1:]
    rows = [row.replace(" ", "") for row in lines]
    if len({len(row) for row in rows}) != 1:
        raise ValueError("room rows must all have the same length")
    chars = np.array([list(row) for row in rows])
    unknown = set(chars.flat) - set(symbols)
    if unknown:
        raise ValueError(f"room has unknown symbols {sorted(unknown)}; use only {symbols!r}")
    walls = chars == wall
    if not (walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()):
        raise ValueError(f"room must be enclosed: its border must be all walls ({wall!r})")
    targets = np.isin(chars, [target, box_on_target, player_on_target])
    boxes = np.isin(chars, [box, box_on_target])
    players = np.argwhere(np.isin(chars, [player, player_on_target]))
    if len(players) != 1:
        raise ValueError(
            f"room must have exactly one player ({player!r} or {player_on_target!r}), found {len(players)}"
        )
    if boxes.sum() == 0 or boxes.sum() != targets.sum():
        raise ValueError(
            f"room must have as many boxes as targets, at least one; found {boxes.sum()} and {targets.sum()}"
        )
    return walls, targets, boxes, (int(players[0][0]), int(players[0][1]))


PICTURE_TEXT = ("Each state shows a picture of the board, one square tile per cell: dark grey wall, beige floor, "
                "red ring target, brown square box, green square box on target, blue disc player.\n")


NEIGHBOURS_LABEL = "Around the player"
NEIGHBOUR_WORDS = ("wall", "floor", "target", "box on target", "box")  # the first five symbols, in words
COLUMNS_LABEL = "Columns (top to bottom):"


def _instructions(symbols: str, observation_format: str = "grid", image_observation: str = "none",
                  neighbours: bool = False, columns: bool = False) -> str:
    wall, floor, target, box_on_target, box, player, player_on_target = symbols
    task = ("You are the player in a Sokoban puzzle. Goal: push every box onto a target. Walk into a box to push it; "
            "boxes cannot be pulled, and a box against a wall or another box does not move.\n")
    if image_observation != "none":
        task += PICTURE_TEXT
    actions = f"Actions: {', '.join(ACTIONS)}."
    if image_observation == "alone":  # no text state to explain
        return task + actions
    if columns:
        actions = ("Columns lists the grid's columns, column 0 first, each from row 0 down: there the cells above and "
                   f"below the player are next to it.\n{actions}")
    if neighbours:
        actions = (f"{NEIGHBOURS_LABEL} names the cell next to the player in each direction "
                   f"({', '.join(NEIGHBOUR_WORDS)}).\n{actions}")
    legend = (f"Legend: {wall} wall, {floor} floor, {target} target, {box} box, {box_on_target} box on target, "
              f"{player} player, {player_on_target} player on target.\n")
    if observation_format == "grid":
        return task + legend + actions
    coordinates = (f"{COORDINATES_NOTE} Targets lists the targets with nothing on them; a line with no cells is "
                   "left out.\n")
    if observation_format == "coord":  # no grid, so no symbols to explain
        return task + coordinates + "The border of the board is wall; Inner walls lists the other walls.\n" + actions
    return task + legend + coordinates + actions


def _tiles(symbols: str) -> dict[str, np.ndarray]:
    """One picture per symbol; the player on a target is the player's disc over the target's ring."""
    wall, floor, target, box_on_target, box, player, player_on_target = symbols
    target_tile = tile(FLOOR_RGB, "ring", TARGET_RGB)
    player_tile = tile(FLOOR_RGB, "disc", PLAYER_RGB)
    disc = (player_tile != FLOOR_RGB).any(axis=-1, keepdims=True)  # (TILE, TILE, 1)
    return {
        wall: tile(WALL_RGB),
        floor: tile(FLOOR_RGB),
        target: target_tile,
        box_on_target: tile(FLOOR_RGB, "square", BOX_ON_TARGET_RGB),
        box: tile(FLOOR_RGB, "square", BOX_RGB),
        player: player_tile,
        player_on_target: np.where(disc, player_tile, target_tile),
    }


class SokobanEnv(gymnasium.Env):
    """Grid Sokoban with text states; `reset(options={"room": text})` loads a fixed room instead of a new level."""

    metadata = {"render_modes": ["ansi", "rgb_array"]}
    # The class attribute describes the default symbols; an instance rewrites it for its configured ones.
    instructions: str = _instructions(LEGEND)
    example_actions: tuple[str, ...] = ("Left",)
    action_choices: str = choices_text(ACTIONS)  # listed in every state message

    def __init__(self, config: SokobanConfig, render_mode: str = "ansi") -> None:
        if render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} must be one of {self.metadata['render_modes']}")
        self.config = config
        self.render_mode = render_mode
        self.instructions = _instructions(config.symbols, config.observation_format, config.image_observation,
                                          config.neighbours, config.columns)
        self.tiles = _tiles(config.symbols)
        self.observation_space = self._space(config.dim_y, config.dim_x)
        self.action_space = spaces.Text(max_length=16)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        if set(options) - {"room"}:
            raise ValueError(f"unknown reset options {sorted(set(options) - {'room'})}; the only option is 'room'")
        if "room" in options:
            self.walls, self.targets, self.boxes, self.player = parse_room(options["room"], self.config.symbols)
        else:
            self.walls, self.targets, self.boxes, self.player = generate_level(self.config, self.np_random)
        self.observation_space = self._space(*self.walls.shape)  # a loaded room sets its own size
        self.num_steps = 0
        return self._observation()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        word = ACTION_BY_WORD.get(action.strip().lower())
        if word is None:
            observation, images = self._observation()
            return observation, 0.0, False, False, step_info(False, False, self._solved()) | images

        self.num_steps += 1
        moved, box_reward = self._move(ACTIONS[word])
        solved = self._solved()
        reward = STEP_REWARD + box_reward + (SOLVED_REWARD if solved else 0.0)
        reward += 0.0 if moved else self.config.noop_reward
        truncated = not solved and self.num_steps >= self.config.max_steps
        observation, images = self._observation()
        return observation, float(reward), solved, truncated, step_info(True, moved, solved) | images

    def sample_action(self, rng: np.random.Generator) -> str:
        return list(ACTIONS)[int(rng.integers(len(ACTIONS)))]

    def describe(self) -> str:
        """Where the player, boxes and targets are, in the observation's own terms. With coordinates in the
        observation (grid_coord, coord) as zero-indexed (row, col) pairs like its coordinate lines, e.g. "The
        player is at (1, 2), the box at (2, 2), the target at (3, 2)."; with the grid alone in rows and columns of
        the text counted from 1 at the top left (walls included), e.g. "The player is at row 2, column 3, the box
        at row 3, column 3, the target at row 4, column 3." The expert's thought of `--describe-state` SFT data
        starts with it."""
        def cells(positions) -> str:  # (row, col) pairs, in row-major order
            if self.config.observation_format != "grid":
                return ", ".join(f"({r}, {c})" for r, c in positions)
            return " and ".join(f"row {r + 1}, column {c + 1}" for r, c in positions)

        many = self.boxes.sum() > 1  # a loaded room may hold another number of boxes than the config's
        return (f"The player is at {cells([self.player])}, "
                f"the box{'es' if many else ''} at {cells(np.argwhere(self.boxes).tolist())}, "
                f"the target{'s' if many else ''} at {cells(np.argwhere(self.targets).tolist())}.")

    def _move(self, direction: Cell) -> tuple[bool, float]:
        """Step the player, pushing the box ahead if the cell beyond it is free. Returns (moved, box reward)."""
        ahead = (self.player[0] + direction[0], self.player[1] + direction[1])
        beyond = (ahead[0] + direction[0], ahead[1] + direction[1])
        if self.walls[ahead]:
            return False, 0.0
        box_reward = 0.0
        if self.boxes[ahead]:
            if self.walls[beyond] or self.boxes[beyond]:
                return False, 0.0
            self.boxes[ahead], self.boxes[beyond] = False, True
            box_reward = BOX_ON_TARGET_REWARD * self.targets[beyond] + BOX_OFF_TARGET_REWARD * self.targets[ahead]
        self.player = ahead
        return True, float(box_reward)

    def _solved(self) -> bool:
        return bool((self.boxes == self.targets).all())

    def _symbol_grid(self) -> np.ndarray:
        wall, floor, target, box_on_target, box, player, player_on_target = self.config.symbols
        grid = np.full(self.walls.shape, floor)  # (H, W) one-character strings
        grid[self.walls] = wall
        grid[self.targets] = target
        grid[self.boxes] = box
        grid[self.boxes & self.targets] = box_on_target
        grid[self.player] = player_on_target if self.targets[self.player] else player
        return grid

    def _space(self, height: int, width: int) -> spaces.Text:
        text = grid_space(height, width, self.config.symbols, self.config.cell_separator,
                          self.config.observation_format, COORDINATE_LABELS)
        if self.config.columns:  # the grid once more, transposed, under its label
            block = f"\n{COLUMNS_LABEL}\n" + grid_text(np.full((width, height), "#"), self.config.cell_separator)
            charset = "".join(sorted(set(text.character_set) | set(COLUMNS_LABEL)))
            text = spaces.Text(max_length=text.max_length + len(block), charset=charset)
        if self.config.neighbours:  # the longest line: every neighbour a box on target
            line = f"\n{NEIGHBOURS_LABEL}: " + ", ".join(f"{word} box on target" for word in ACTIONS)
            charset = "".join(sorted(set(text.character_set) | set(line) | set("".join(NEIGHBOUR_WORDS))))
            text = spaces.Text(max_length=text.max_length + len(line), charset=charset)
        return image_space(text, self.config.image_observation)

    def _observation(self) -> tuple[str, dict]:
        """What the agent is shown, and the info entries that carry its picture (utils.with_image)."""
        return with_image(self._text(), lambda: grid_to_rgb(self._symbol_grid(), self.tiles),
                          self.config.image_observation)

    def _text(self) -> str:
        _, _, target, box_on_target, box, player, player_on_target = self.config.symbols
        grid = self._symbol_grid()
        # one line per symbol, read off the grid itself: the lines cannot disagree with it
        cells = {"Targets": grid == target, "Boxes": grid == box, "Boxes on target": grid == box_on_target,
                 "Player": grid == player, "Player on target": grid == player_on_target}
        if self.config.observation_format == "coord":  # no grid to show the walls
            inner_walls = self.walls.copy()
            inner_walls[[0, -1], :] = inner_walls[:, [0, -1]] = False
            cells = {"Inner walls": inner_walls, **cells}
        text = observation_text(self.config.observation_format, grid, self.config.cell_separator, cells)
        if self.config.columns:
            text += f"\n{COLUMNS_LABEL}\n" + grid_text(grid.T, self.config.cell_separator)
        if not self.config.neighbours:
            return text
        # `Around the player: Up wall, Down floor, ...`: the grid's cell next to the player in each direction, in words
        words, (r, c) = dict(zip(self.config.symbols, NEIGHBOUR_WORDS)), self.player
        around = ", ".join(f"{name} {words[grid[r + dr, c + dc]]}" for name, (dr, dc) in ACTIONS.items())
        return f"{text}\n{NEIGHBOURS_LABEL}: {around}"

    def render(self) -> str | np.ndarray:
        """The text state ("ansi"), or a (H * TILE, W * TILE, 3) uint8 picture ("rgb_array")."""
        if self.render_mode == "rgb_array":
            return grid_to_rgb(self._symbol_grid(), self.tiles)
        return self._text()
