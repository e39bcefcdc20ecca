"""gym-sokoban (PyPI `gym-sokoban==0.0.6`), the Sokoban RAGEN started from, as a RAGEN text environment.

Its levels, rules and rewards are the package's own, unchanged: the level generator (a random walk carves
the room, then a depth-first reverse play pulls the boxes off their targets) and `SokobanEnv.step`. RAGEN's
`sokoban` env re-implements those rules (tests/ragen/envs/test_sokoban_reference.py checks them against this
package) but generates its own levels; this env is the original, to compare with.

The package needs the old `gym` and imports `pkg_resources` (setuptools<81), which a training venv should not
have to carry, so it is imported only when an env is built (`import ragen.envs` never needs it) and is meant
to run on an environment server in a virtualenv of its own:

    bash scripts/make_env_venv.sh gym_sokoban .venv-gym-sokoban
    ... custom_envs.GymSokoban.server.spawn=true custom_envs.GymSokoban.server.python=.venv-gym-sokoban/bin/python

Determinism: the generator draws from the global `random` and `np.random` and keeps its search in module
globals. `reset` seeds both global streams from the env's own `np_random`, generates under a module-level
lock and then puts the global states back, so the same seed gives the same level however many sessions a
server runs at once, and a trainer's global random state is left as it was.

Actions: Up, Down, Left, Right (any case) are gym-sokoban's push actions, which push a box ahead or else walk.
Any other text is invalid: nothing changes and it does not count toward `max_steps`. The text state is RAGEN
Sokoban's for the same cells, in the same observation formats, so the sokoban recipes' prompts fit as they are.
"""

import contextlib
import io
import random
import threading
import warnings
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

from ragen.envs.sokoban import ACTIONS, COORDINATE_LABELS, LEGEND, SokobanEnv, _instructions
from ragen.envs.utils import check_cell_separator, check_observation_format, grid_space, observation_text, step_info

# gym-sokoban's cell codes (room_fixed: walls, floor, targets; room_state adds boxes and the player); its
# renderer draws a player on a target as code 6. RAGEN's LEGEND lists its symbols in this same order.
WALL_CODE, FLOOR_CODE, TARGET_CODE, BOX_ON_TARGET_CODE, BOX_CODE, PLAYER_CODE, PLAYER_ON_TARGET_CODE = range(7)
SYMBOLS = np.array(list(LEGEND))  # symbol of each code
INSTALL_HINT = ("the gym_sokoban env needs gym-sokoban==0.0.6 and setuptools<81 (it imports pkg_resources): serve it "
                "from a venv of its own (`bash scripts/make_env_venv.sh gym_sokoban .venv-gym-sokoban`, then "
                "custom_envs.<tag>.server.spawn=true custom_envs.<tag>.server.python=.venv-gym-sokoban/bin/python), "
                "or pip install 'gym-sokoban==0.0.6' 'setuptools<81' here")

# Held around what touches process-wide state: gym-sokoban's level generation (the global random streams, its
# module globals) and its quiet import (sys.stderr, the warning filters).
_PROCESS_WIDE_LOCK = threading.Lock()


@dataclass
class GymSokobanConfig:
    dim_x: int = 6  # room width in cells, wall border included
    dim_y: int = 6  # room height in cells, wall border included
    num_boxes: int = 1  # boxes (and targets) per room
    max_steps: int = 100  # valid actions before the episode is truncated
    cell_separator: str = ""  # between the cells of a row: "" or " " (see check_cell_separator)
    observation_format: str = "grid"  # "grid", "grid_coord" or "coord" (ragen/envs/sokoban.py's docstring)

    def __post_init__(self) -> None:
        for name in ("dim_x", "dim_y"):
            if getattr(self, name) < 5:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 5: a wall border around room to walk")
        interior = (self.dim_x - 2) * (self.dim_y - 2)
        # gym-sokoban retries, by recursion, until a room's floor holds the boxes, the player and one cell more:
        # a room that never can would end in a RecursionError
        if not 1 <= self.num_boxes <= interior - 2:
            raise ValueError(f"num_boxes={self.num_boxes} must be between 1 and {interior - 2} for a "
                             f"{self.dim_x}x{self.dim_y} room: change num_boxes or enlarge the room")
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        check_cell_separator(self.cell_separator)
        check_observation_format(self.observation_format)


def _import_sokoban_env():
    """gym_sokoban.envs.sokoban_env, imported quietly: the package warns that pkg_resources is deprecated and
    the old gym prints an 'unmaintained' notice to stderr on import."""
    with _PROCESS_WIDE_LOCK, warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            from gym_sokoban.envs import sokoban_env
        except ImportError as error:
            raise ImportError(f"{INSTALL_HINT} ({error})") from None
    return sokoban_env


@contextlib.contextmanager
def _global_random_seeded(seed: int):
    """The global `random` and `np.random` seeded with `seed` inside, restored afterwards."""
    saved = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


class GymSokobanEnv(gymnasium.Env):
    """gym-sokoban's SokobanEnv behind RAGEN's text interface (see the module docstring)."""

    metadata = {"render_modes": ["ansi"]}
    # The class attributes describe the default "grid" format; an instance rewrites them for its own.
    instructions: str = SokobanEnv.instructions
    example_actions: tuple[str, ...] = SokobanEnv.example_actions
    action_choices: str = SokobanEnv.action_choices

    def __init__(self, config: GymSokobanConfig, render_mode: str = "ansi") -> None:
        self.config = config
        self.render_mode = render_mode
        self.instructions = _instructions(LEGEND, config.observation_format)
        self.observation_space = grid_space(config.dim_y, config.dim_x, LEGEND, config.cell_separator,
                                            config.observation_format, COORDINATE_LABELS)
        self.action_space = spaces.Text(max_length=16)
        sokoban_env = _import_sokoban_env()
        # gym-sokoban's action ids 1-4 are "push up", ... "push right": word -> id
        self.action_ids = {name.split()[1]: action_id for action_id, name in sokoban_env.ACTION_LOOKUP.items()
                           if name.startswith("push ")}
        assert sorted(self.action_ids) == sorted(word.lower() for word in ACTIONS), self.action_ids
        self.game = sokoban_env.SokobanEnv(dim_room=(config.dim_y, config.dim_x), max_steps=config.max_steps,
                                           num_boxes=config.num_boxes, reset=False)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """A new level of gym-sokoban's generator; `options` are not used."""
        super().reset(seed=seed)
        generator_seed = int(self.np_random.integers(2**32))
        with _PROCESS_WIDE_LOCK, _global_random_seeded(generator_seed):
            # "tiny_rgb_array": a one-pixel-per-cell picture that we discard; the default mode reads PNG files
            self.game.reset(render_mode="tiny_rgb_array")
        return self.render(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        action_id = self.action_ids.get(action.strip().lower())
        if action_id is None:  # the episode ends once solved, so an invalid action never sees a solved room
            return self.render(), 0.0, False, False, step_info(valid=False, effective=False, success=False)
        _, reward, done, info = self.game.step(action_id, observation_mode="tiny_rgb_array")
        # gym-sokoban's one `done` is either the solve or its step limit; its info says which
        solved = bool(done and info["all_boxes_on_target"])
        truncated = bool(done and not solved)
        return self.render(), float(reward), solved, truncated, step_info(True, info["action.moved_player"], solved)

    def sample_action(self, rng: np.random.Generator) -> str:
        return list(ACTIONS)[int(rng.integers(len(ACTIONS)))]

    def render(self) -> str:
        """The text state, written as RAGEN's Sokoban writes the same cells."""
        codes = self.game.room_state.astype(int)  # (H, W)
        codes[(codes == PLAYER_CODE) & (self.game.room_fixed == TARGET_CODE)] = PLAYER_ON_TARGET_CODE
        grid = SYMBOLS[codes]  # (H, W) one-character strings
        cells = {label: codes == code for label, code in zip(
            COORDINATE_LABELS[1:], (TARGET_CODE, BOX_CODE, BOX_ON_TARGET_CODE, PLAYER_CODE, PLAYER_ON_TARGET_CODE))}
        if self.config.observation_format == "coord":  # no grid to show the walls
            inner_walls = codes == WALL_CODE
            inner_walls[[0, -1], :] = inner_walls[:, [0, -1]] = False
            cells = {COORDINATE_LABELS[0]: inner_walls, **cells}
        return observation_text(self.config.observation_format, grid, self.config.cell_separator, cells)
