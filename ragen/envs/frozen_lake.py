"""FrozenLake: walk across a frozen lake from the start to the goal without falling into a hole.

A thin text wrapper around gymnasium's FrozenLake. Each reset draws a new square map with gymnasium's
`generate_random_map`, which redraws until a path from the start (top left) to the goal (bottom right)
exists, so every map is solvable. The dynamics are gymnasium's transition table: on slippery ice a move
goes the intended way with probability 1/3 and to either side (a right angle) with probability 1/3 each,
never backwards; a move into the lake's edge leaves the player in place. Reward 1.0 for reaching the goal,
0.0 otherwise; the episode ends on the goal or in a hole.

Departure from gymnasium: the randomness (map and slips) comes only from this env's `self.np_random`: the
map seed is drawn from it and the inner gymnasium env is handed the same generator, so one seed fixes the
map and, for the same actions, the same slips. Pictures are drawn from tiles here, not with pygame.

`optimal_policy` solves a map by value iteration for the oracle baseline; `oracle_action` applies it to an
env's current state.

Observation formats (`FrozenLakeConfig.observation_format`, see utils.check_observation_format): "grid" is the
grid alone; "grid_coord" writes the board size and coordinates above it, RAGEN-2's observation:
    Board size: 4 rows x 4 cols (zero-indexed).
    Start: (0, 0)
    Goal: (3, 3)
    Player: (0, 0)
    Holes: (0, 2), (1, 3)
    Grid:
    P_O_
    ...
Coordinates are 0-based (row, col), several cells in row-major order. The lines name the map, not the symbols:
Goal and Holes keep listing a cell the player stands on (drawn √ or X), and Start (drawn as ice) is listed
though the grid does not show it. A map without holes has no Holes line. "coord" writes the same lines without
the grid.
"""

from dataclasses import dataclass
from functools import lru_cache

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text import frozen_lake as gym_frozen_lake

from ragen.envs.utils import (
    COORDINATES_NOTE, check_cell_separator, check_image_observation, check_observation_format, choices_text,
    grid_space, grid_to_rgb, image_space, observation_text, step_info, tile, with_image,
)

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}  # gymnasium's action ids
ACTION_WORDS = ["Left", "Down", "Right", "Up"]  # indexed by action id

# Map letters (gymnasium's desc) and the text-state symbols (RAGEN's FrozenLake legend).
START, FROZEN_LETTER, HOLE_LETTER, GOAL_LETTER = "S", "F", "H", "G"
PLAYER, FROZEN, HOLE, GOAL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "_", "O", "G", "X", "√"
LEGEND = PLAYER + FROZEN + HOLE + GOAL + PLAYER_IN_HOLE + PLAYER_ON_GOAL
LETTER_TO_SYMBOL = {START: FROZEN, FROZEN_LETTER: FROZEN, HOLE_LETTER: HOLE, GOAL_LETTER: GOAL}
PLAYER_SYMBOL = {START: PLAYER, FROZEN_LETTER: PLAYER, HOLE_LETTER: PLAYER_IN_HOLE, GOAL_LETTER: PLAYER_ON_GOAL}

ICE, WATER, GRASS, BODY = (200, 230, 250), (20, 60, 140), (60, 170, 80), (220, 50, 40)
TILES = {
    FROZEN: tile(ICE),
    HOLE: tile(WATER),
    GOAL: tile(GRASS, "square", (250, 210, 40)),
    PLAYER: tile(ICE, "disc", BODY),
    PLAYER_IN_HOLE: tile(WATER, "disc", BODY),
    PLAYER_ON_GOAL: tile(GRASS, "disc", BODY),
}

MAX_VALUE_ITERATIONS = 100_000  # a bound only; gamma < 1 makes value iteration converge long before
VALUE_TOLERANCE = 1e-10

TASK_TEXT = (
    "You are walking on a frozen lake. Goal: reach the goal without falling into a hole; falling in ends "
    "the game. Moving into the edge of the lake leaves you where you are."
)
LEGEND_TEXT = (
    f"Legend: {PLAYER} you, {FROZEN} frozen ice, {HOLE} hole, {GOAL} goal, {PLAYER_IN_HOLE} you fell into "
    f"a hole, {PLAYER_ON_GOAL} you reached the goal."
)
ACTIONS_TEXT = "Actions: Left, Down, Right, Up."
PICTURE_TEXT = ("Each state shows a picture of the lake, one square tile per cell: light blue ice, dark blue "
                "hole, green goal with a yellow square, and you as a red disc.")
COORDINATES_TEXT = COORDINATES_NOTE + " Player is where you are; a map without holes has no Holes line."
INSTRUCTIONS = "\n".join([TASK_TEXT, LEGEND_TEXT, ACTIONS_TEXT])
COORDINATE_LABELS = ("Start", "Goal", "Player", "Holes")  # the coordinate lines, in the order written
SLIPPERY_NOTE = (
    "\nThe ice is slippery: a move goes the way you chose only one time in three; otherwise you slide "
    "sideways, at a right angle to the left or to the right of it. You never slide backwards."
)


@dataclass
class FrozenLakeConfig:
    size: int = 4  # side of the square map, in cells; start top left, goal bottom right
    p: float = 0.8  # probability that a tile is frozen rather than a hole (low p on big maps: slow redraws)
    is_slippery: bool = True  # a move goes the intended way with probability 1/3, each side 1/3
    max_steps: int = 100  # valid actions before the episode is truncated
    cell_separator: str = ""  # between the cells of a row: "" or " " (see check_cell_separator)
    observation_format: str = "grid"  # "grid", "grid_coord" or "coord" (see the module docstring)
    image_observation: str = "none"  # "none", "alone" (a picture instead of the text) or "with_text" (utils)

    def __post_init__(self) -> None:
        check_cell_separator(self.cell_separator)
        check_observation_format(self.observation_format)
        check_image_observation(self.image_observation)
        if self.size < 2:
            raise ValueError(f"size={self.size} must be >= 2: the start and the goal need separate cells")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"p={self.p} must be in (0, 1]: it is the probability that a tile is frozen")
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")


def _letters(desc: list[str] | np.ndarray) -> np.ndarray:
    """A map as a (H, W) array of gymnasium's letters, from a list of row strings or a (H, W) array."""
    if isinstance(desc, np.ndarray):
        return desc.astype(str)
    return np.array([list(row) for row in desc])


def parse_map(desc: list[str]) -> np.ndarray:
    """Check a map given as rows of gymnasium's letters (S, F, H, G); return it as a (H, W) array."""
    if not desc or len({len(row) for row in desc}) != 1 or not desc[0]:
        raise ValueError("map rows must be non-empty and all of the same length")
    letters = _letters(desc)
    unknown = set(letters.flat) - {START, FROZEN_LETTER, HOLE_LETTER, GOAL_LETTER}
    if unknown:
        raise ValueError(f"map has unknown letters {sorted(unknown)}; use only S (start), F, H and G")
    if (letters == START).sum() != 1 or (letters == GOAL_LETTER).sum() < 1:
        raise ValueError("map must have exactly one start S and at least one goal G")
    return letters


@lru_cache(maxsize=256)
def _cached_policy(rows: tuple[str, ...], is_slippery: bool, gamma: float) -> np.ndarray:
    return optimal_policy(list(rows), is_slippery, gamma)


def optimal_policy(desc: list[str] | np.ndarray, is_slippery: bool, gamma: float = 0.99) -> np.ndarray:
    """The best action id per flattened cell (row * W + col) by value iteration; shape (H * W,).

    `desc` is a map in gymnasium's letters (rows of strings or a (H, W) array, e.g. `env.desc`). The
    transition model is gymnasium's own table for that map, so the oracle plans with the exact dynamics the
    env steps with. Rewards: 1 on entering the goal; holes and the goal end the episode (value 0 after).
    `gamma` < 1 makes the greedy policy prefer shorter routes; on a deterministic map it walks a shortest
    path. Cells with no way to the goal, holes and the goal get action 0.
    """
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma={gamma} must be in (0, 1): with gamma = 1 standing still ties with progress")
    letters = _letters(desc)
    table = gym_frozen_lake.FrozenLakeEnv(desc=["".join(row) for row in letters], is_slippery=is_slippery).P
    num_states, num_actions = letters.size, len(ACTION_WORDS)
    expected_reward = np.zeros((num_states, num_actions))  # (S, A)
    continue_prob = np.zeros((num_states, num_actions, num_states))  # (S, A, S'): reached and not ended
    for state, by_action in table.items():
        for action, outcomes in by_action.items():
            for prob, next_state, reward, terminated in outcomes:
                expected_reward[state, action] += prob * reward
                continue_prob[state, action, next_state] += prob * (not terminated)

    values = np.zeros(num_states)
    for _ in range(MAX_VALUE_ITERATIONS):
        q_values = expected_reward + gamma * continue_prob @ values  # (S, A)
        new_values = q_values.max(axis=1)
        converged = np.abs(new_values - values).max() < VALUE_TOLERANCE
        values = new_values
        if converged:
            break
    return (expected_reward + gamma * continue_prob @ values).argmax(axis=1)


def _instructions(observation_format: str, is_slippery: bool, image_observation: str = "none") -> str:
    lines = {"grid": [TASK_TEXT, LEGEND_TEXT, ACTIONS_TEXT],
             "grid_coord": [TASK_TEXT, LEGEND_TEXT, COORDINATES_TEXT, ACTIONS_TEXT],
             "coord": [TASK_TEXT, COORDINATES_TEXT, ACTIONS_TEXT]}[observation_format]  # coord: no symbols to explain
    if image_observation == "alone":  # no text state to explain
        lines = [TASK_TEXT, PICTURE_TEXT, ACTIONS_TEXT]
    elif image_observation == "with_text":
        lines = [TASK_TEXT, PICTURE_TEXT, *lines[1:]]
    return "\n".join(lines) + (SLIPPERY_NOTE if is_slippery else "")


def oracle_action(env: "FrozenLakeEnv", gamma: float = 0.99) -> str:
    """The oracle's action word for the env's current state (policies are cached per map)."""
    rows = tuple("".join(row) for row in env.desc)
    policy = _cached_policy(rows, env.config.is_slippery, gamma)
    row, col = env.position
    return ACTION_WORDS[policy[row * env.desc.shape[1] + col]]


class FrozenLakeEnv(gymnasium.Env):
    """FrozenLake with text states; `reset(options={"map": rows})` loads a fixed map instead of a random one.

    Attributes for the oracle and tests: `desc`, the map as a (H, W) array of gymnasium's letters
    (S start, F frozen, H hole, G goal); `position`, the player's (row, col); `lake`, the inner gymnasium
    FrozenLakeEnv that holds the transition table and steps the player.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"]}
    instructions: str = INSTRUCTIONS + SLIPPERY_NOTE
    # Four, as a turn may take four: shown one, the model answered one action per turn (config/frozen_lake.yaml)
    example_actions: tuple[str, ...] = ("Right", "Down", "Right", "Down")
    action_choices: str = choices_text(ACTION_WORDS)  # listed in every state message

    def __init__(self, config: FrozenLakeConfig, render_mode: str = "ansi") -> None:
        if render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} must be one of {self.metadata['render_modes']}")
        self.config = config
        self.render_mode = render_mode
        self.instructions = _instructions(config.observation_format, config.is_slippery, config.image_observation)
        self.observation_space = self._space(config.size, config.size)
        self.action_space = spaces.Text(max_length=16)
        self.lake: gym_frozen_lake.FrozenLakeEnv | None = None  # built by reset
        self.lake_rows: list[str] = []  # the map self.lake was built for

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        if set(options) - {"map"}:
            raise ValueError(f"unknown reset options {sorted(set(options) - {'map'})}; the only option is 'map'")
        if "map" in options:
            self.desc = parse_map(options["map"])
        else:
            map_seed = int(self.np_random.integers(2**32))
            rows = gym_frozen_lake.generate_random_map(self.config.size, self.config.p, seed=map_seed)
            self.desc = _letters(rows)
        self.observation_space = self._space(*self.desc.shape)
        rows = ["".join(row) for row in self.desc]
        self.board = np.array([[LETTER_TO_SYMBOL[letter] for letter in row] for row in rows])  # (H, W)
        if self.lake is None or self.lake_rows != rows:  # building the transition table is most of a reset
            self.lake = gym_frozen_lake.FrozenLakeEnv(desc=rows, is_slippery=self.config.is_slippery)
            self.lake_rows = rows
        # Set before its reset, which then keeps it: every slip is drawn from our generator.
        self.lake.np_random = self.np_random
        self.lake.reset()
        self.num_steps = 0
        return self._observation()

    @property
    def position(self) -> tuple[int, int]:
        """The player's (row, col)."""
        row, col = divmod(int(self.lake.s), self.desc.shape[1])
        return row, col

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        action_id = ACTIONS.get(action.strip().lower())
        if action_id is None:
            observation, images = self._observation()
            return observation, 0.0, False, False, step_info(False, False, self._on_goal()) | images

        self.num_steps += 1
        before = self.position
        _, reward, terminated, _, _ = self.lake.step(action_id)
        truncated = not terminated and self.num_steps >= self.config.max_steps
        info = step_info(True, self.position != before, self._on_goal())
        observation, images = self._observation()
        return observation, float(reward), bool(terminated), truncated, info | images

    def _on_goal(self) -> bool:
        return bool(self.desc[self.position] == GOAL_LETTER)

    def _symbols(self) -> np.ndarray:
        """The text state as a (H, W) array of legend symbols."""
        grid = self.board.copy()
        grid[self.position] = PLAYER_SYMBOL[self.desc[self.position]]
        return grid

    def _space(self, height: int, width: int) -> spaces.Text:
        text = grid_space(height, width, LEGEND, self.config.cell_separator, self.config.observation_format,
                          COORDINATE_LABELS)
        return image_space(text, self.config.image_observation)

    def _observation(self) -> tuple[str, dict]:
        """What the agent is shown, and the info entries that carry its picture (utils.with_image)."""
        return with_image(self._text(), lambda: grid_to_rgb(self._symbols(), TILES), self.config.image_observation)

    def _text(self) -> str:
        player = np.zeros(self.desc.shape, dtype=bool)
        player[self.position] = True
        cells = {"Start": self.desc == START, "Goal": self.desc == GOAL_LETTER, "Player": player,
                 "Holes": self.desc == HOLE_LETTER}
        return observation_text(self.config.observation_format, self._symbols(), self.config.cell_separator, cells)

    def render(self) -> str | np.ndarray:
        if self.render_mode == "rgb_array":
            return grid_to_rgb(self._symbols(), TILES)
        return self._text()

    def sample_action(self, rng: np.random.Generator) -> str:
        return ACTION_WORDS[rng.integers(len(ACTION_WORDS))]
