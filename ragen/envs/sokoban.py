"""Sokoban: push every box onto a target in a small walled room.

Levels are generated backwards, so that every level is solvable without running a solver:
  1. carve a room: a random walk inside the wall border turns walls into floor;
  2. put the boxes on targets (the solved state) and the player on a free floor cell;
  3. play in reverse for `search_depth` random moves, where the player either steps or pulls a box it
     stands next to (steps away from it and the box follows); a pull is the exact undo of a push.
The start state is the visited state with every box off a target and the boxes farthest from their
targets. Undoing the reverse moves one by one solves the level, so a solution always exists.

Rewards follow gym-sokoban: -0.1 per step, +1 for pushing a box onto a target, -1 for pushing one off,
+10 when every box is on a target.
"""

from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

ACTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}  # (row, column) offsets
DIRECTIONS = list(ACTIONS.values())
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "√", "X", "P", "S"
LEGEND = WALL + FLOOR + TARGET + BOX_ON_TARGET + BOX + PLAYER + PLAYER_ON_TARGET

FLOOR_FRACTION = 0.7  # share of the room's interior that the random walk turns into floor
TURN_PROB = 0.2  # chance per carving step that the walk changes direction
PULL_PROB = 0.8  # chance of pulling rather than stepping when next to a box: short walks move boxes farther
MAX_GENERATION_ATTEMPTS = 1000  # rooms tried before giving up; a 6x6 one-box room succeeds ~60% of the time

Cell = tuple[int, int]


@dataclass
class SokobanConfig:
    dim_x: int = 6  # room width in cells, wall border included
    dim_y: int = 6  # room height in cells, wall border included
    num_boxes: int = 1  # boxes (and targets) per room
    max_steps: int = 100  # valid actions before the episode is truncated
    search_depth: int = 30  # random reverse moves played from the solved state to make a level

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
        if self.search_depth < 1:
            raise ValueError(f"search_depth={self.search_depth} must be >= 1")


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


def reverse_play(
    walls: np.ndarray, targets: list[Cell], player: Cell, search_depth: int, rng: np.random.Generator
) -> tuple[list[Cell], Cell] | None:
    """Random reverse moves from the solved state; return (boxes, player) of the hardest-looking state.

    "Hardest-looking" is the visited state with every box off a target whose boxes lie farthest (Manhattan,
    summed) from the targets they started on. Ties go to the latest such state: by then the player has
    usually walked away from the box it last pulled instead of standing ready to push it back. None when
    no visited state has every box off a target.
    """
    boxes = list(targets)
    best, best_distance = None, 1
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

        distance = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
        if distance >= best_distance and not set(boxes) & set(targets):
            best, best_distance = (list(boxes), player), distance
    return best


def generate_level(
    config: SokobanConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Cell]:
    """A solvable level as (walls, targets, boxes) boolean (H, W) grids and the player's cell."""
    interior = (config.dim_x - 2) * (config.dim_y - 2)
    num_floor = max(round(FLOOR_FRACTION * interior), config.num_boxes + 2)
    for _ in range(MAX_GENERATION_ATTEMPTS):
        walls = carve_room(config.dim_y, config.dim_x, num_floor, rng)
        floor = [tuple(cell) for cell in np.argwhere(~walls).tolist()]
        picked = rng.choice(len(floor), config.num_boxes + 1, replace=False)
        targets, player = [floor[i] for i in picked[:-1]], floor[picked[-1]]
        result = reverse_play(walls, targets, player, config.search_depth, rng)
        if result is not None:
            boxes, player = result
            return walls, _cells_to_grid(targets, walls.shape), _cells_to_grid(boxes, walls.shape), player
    raise RuntimeError(
        f"could not generate a {config.dim_x}x{config.dim_y} Sokoban level with {config.num_boxes} box(es) off "
        f"their targets in {MAX_GENERATION_ATTEMPTS} attempts: increase search_depth or the room size, or "
        "lower num_boxes"
    )


def _cells_to_grid(cells: list[Cell], shape: tuple[int, int]) -> np.ndarray:
    grid = np.zeros(shape, dtype=bool)
    grid[tuple(np.array(cells).T)] = True
    return grid


def parse_room(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, Cell]:
    """Read a room written in the render legend into (walls, targets, boxes) grids and the player's cell."""
    rows = text.strip("\n").split("\n")
    if len({len(row) for row in rows}) != 1:
        raise ValueError("room rows must all have the same length")
    chars = np.array([list(row) for row in rows])
    unknown = set(chars.flat) - set(LEGEND)
    if unknown:
        raise ValueError(f"room has unknown symbols {sorted(unknown)}; use only {LEGEND!r}")
    walls = chars == WALL
    if not (walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()):
        raise ValueError(f"room must be enclosed: its border must be all walls ({WALL!r})")
    targets = np.isin(chars, [TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET])
    boxes = np.isin(chars, [BOX, BOX_ON_TARGET])
    players = np.argwhere(np.isin(chars, [PLAYER, PLAYER_ON_TARGET]))
    if len(players) != 1:
        raise ValueError(
            f"room must have exactly one player ({PLAYER!r} or {PLAYER_ON_TARGET!r}), found {len(players)}"
        )
    if boxes.sum() == 0 or boxes.sum() != targets.sum():
        raise ValueError(
            f"room must have as many boxes as targets, at least one; found {boxes.sum()} and {targets.sum()}"
        )
    return walls, targets, boxes, (int(players[0][0]), int(players[0][1]))


def _text_space(height: int, width: int) -> spaces.Text:
    return spaces.Text(max_length=(width + 1) * height, charset=LEGEND + "\n")


class SokobanEnv(gymnasium.Env):
    """Grid Sokoban with text states; `reset(options={"room": text})` loads a fixed room instead of a new level."""

    metadata = {"render_modes": ["ansi"]}
    instructions: str = (
        "You are the player in a Sokoban puzzle. Goal: push every box onto a target. Walk into a box to push it; "
        "boxes cannot be pulled, and a box against a wall or another box does not move.\n"
        f"Legend: {WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on target, "
        f"{PLAYER} player, {PLAYER_ON_TARGET} player on target.\n"
        "Actions: Up, Down, Left, Right."
    )
    example_action: str = "Left"

    def __init__(self, config: SokobanConfig, render_mode: str = "ansi") -> None:
        self.config = config
        self.render_mode = render_mode
        self.observation_space = _text_space(config.dim_y, config.dim_x)
        self.action_space = spaces.Text(max_length=16)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        if set(options) - {"room"}:
            raise ValueError(f"unknown reset options {sorted(set(options) - {'room'})}; the only option is 'room'")
        if "room" in options:
            self.walls, self.targets, self.boxes, self.player = parse_room(options["room"])
            self.observation_space = _text_space(*self.walls.shape)
        else:
            self.walls, self.targets, self.boxes, self.player = generate_level(self.config, self.np_random)
        self.num_steps = 0
        return self.render(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        direction = ACTIONS.get(action.strip().lower())
        if direction is None:
            info = {"action_is_valid": False, "action_is_effective": False, "success": self._solved()}
            return self.render(), 0.0, False, False, info

        self.num_steps += 1
        moved, box_reward = self._move(direction)
        solved = self._solved()
        reward = STEP_REWARD + box_reward + (SOLVED_REWARD if solved else 0.0)
        truncated = not solved and self.num_steps >= self.config.max_steps
        info = {"action_is_valid": True, "action_is_effective": moved, "success": solved}
        return self.render(), reward, solved, truncated, info

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

    def render(self) -> str:
        grid = np.full(self.walls.shape, FLOOR)
        grid[self.walls] = WALL
        grid[self.targets] = TARGET
        grid[self.boxes] = BOX
        grid[self.boxes & self.targets] = BOX_ON_TARGET
        grid[self.player] = PLAYER_ON_TARGET if self.targets[self.player] else PLAYER
        return "\n".join("".join(row) for row in grid)
