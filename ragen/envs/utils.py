"""Pieces every grid environment shares: the step `info`, the text state in its observation formats, tile pictures
for `rgb_array`, a shortest-path search."""

import base64
import io
import struct
import zlib
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces

TILE = 16  # side of one grid cell in rgb_array pictures, in pixels
State = TypeVar("State", bound=Hashable)


def step_info(valid: bool, effective: bool, success: bool) -> dict[str, bool]:
    """The keys every environment's `info` carries after a step (DESIGN.md)."""
    return {"action_is_valid": bool(valid), "action_is_effective": bool(effective), "success": bool(success)}


def choices_text(words: Iterable[str]) -> str:
    """"Up, Down, Left or Right": an env's moves as its state message lists them (`action_choices`)."""
    *rest, last = words
    return f"{', '.join(rest)} or {last}"


CELL_SEPARATORS = ("", " ")


def check_cell_separator(separator: str) -> None:
    """A grid env's `cell_separator` is written between the cells of a row. With " " SmolLM2's tokenizer gives each
    cell a token of its own; with "" it merges runs ("##", "____") and a column sits at a different token
    offset in each row."""
    if separator not in CELL_SEPARATORS:
        raise ValueError(f"cell_separator={separator!r} must be '' (cells side by side) or ' ' (one space between)")


def grid_text(grid: np.ndarray, separator: str) -> str:
    """A (H, W) array of one-character symbols as text: one line per row, cells joined by `separator`."""
    return "\n".join(separator.join(row) for row in grid)


OBSERVATION_FORMATS = ("grid", "grid_coord", "coord")
COORDINATES_NOTE = (
    "Coordinates are zero-indexed (row, column) counted from the top-left corner: Up is row - 1, Down row + 1, "
    "Left column - 1, Right column + 1."
)


def check_observation_format(observation_format: str) -> None:
    """A grid env's `observation_format`: "grid" (the grid alone), "grid_coord" (the board size and each kind of
    cell's coordinates, then the grid; RAGEN-2's observation) or "coord" (coordinates alone). SmolLM2's tokenizer
    merges runs of cells ("____"), so a small model finds a symbol's row and column more easily when it is
    written out."""
    if observation_format not in OBSERVATION_FORMATS:
        raise ValueError(
            f"observation_format={observation_format!r} must be one of {', '.join(map(repr, OBSERVATION_FORMATS))}: "
            "'grid' (the grid alone), 'grid_coord' (coordinates, then the grid) or 'coord' (coordinates alone)"
        )


def board_header(height: int, width: int) -> str:
    return f"Board size: {height} rows x {width} cols (zero-indexed)."


def coordinates_text(label: str, cells: np.ndarray) -> str:
    """"Boxes: (2, 3), (3, 4)": the True cells of a (H, W) boolean mask as (row, col) pairs, in row-major order."""
    return f"{label}: " + ", ".join(f"({row}, {col})" for row, col in np.argwhere(cells).tolist())


def observation_text(observation_format: str, grid: np.ndarray, separator: str, cells: dict[str, np.ndarray]) -> str:
    """The text state of a (H, W) grid of symbols in `observation_format` (see check_observation_format).

    `cells` maps each coordinate line's label to a (H, W) boolean mask, in the order the lines are written; a
    label with no cells gets no line. The grid alone is `grid_text`, byte for byte.
    """
    if observation_format == "grid":
        return grid_text(grid, separator)
    lines = [board_header(*grid.shape)]
    lines += [coordinates_text(label, mask) for label, mask in cells.items() if mask.any()]
    if observation_format == "grid_coord":
        lines += ["Grid:", grid_text(grid, separator)]
    return "\n".join(lines)


# Image observations (VAGEN's convention): the observation text holds IMAGE_PLACEHOLDER where each picture of
# `info["images"]` stands, in order; a picture is an (H, W, 3) uint8 array, the env's `rgb_array` render.
IMAGE_PLACEHOLDER = "<image>"
IMAGE_OBSERVATIONS = ("none", "alone", "with_text")


def check_image_observation(image_observation: str) -> None:
    """A grid env's `image_observation`: "none" (text only), "alone" (the picture of the board instead of the
    text: the observation is IMAGE_PLACEHOLDER) or "with_text" (the picture, then the text of
    `observation_format`)."""
    if image_observation not in IMAGE_OBSERVATIONS:
        raise ValueError(f"image_observation={image_observation!r} must be one of "
                         f"{', '.join(map(repr, IMAGE_OBSERVATIONS))}: 'none' (text only), 'alone' (a picture of "
                         "the board instead of the text) or 'with_text' (the picture, then the text)")


def with_image(text: str, picture: Callable[[], np.ndarray], image_observation: str) -> tuple[str, dict]:
    """The observation and its info entries in `image_observation` mode, from the text state and a function
    that draws the board (called only when a picture is shown)."""
    if image_observation == "none":
        return text, {}
    shown = IMAGE_PLACEHOLDER if image_observation == "alone" else f"{IMAGE_PLACEHOLDER}\n{text}"
    return shown, {"images": [picture()]}


def image_space(text_space: spaces.Text, image_observation: str) -> spaces.Text:
    """The observation space of `text_space`'s observations in `image_observation` mode (see `with_image`)."""
    if image_observation == "none":
        return text_space
    if image_observation == "alone":
        return spaces.Text(max_length=len(IMAGE_PLACEHOLDER), charset=IMAGE_PLACEHOLDER)
    return spaces.Text(max_length=len(IMAGE_PLACEHOLDER) + 1 + text_space.max_length,
                       charset="".join(sorted(text_space.character_set | set(IMAGE_PLACEHOLDER + "\n"))))


def grid_space(
    height: int,
    width: int,
    symbols: str,
    separator: str = "",
    observation_format: str = "grid",
    labels: tuple[str, ...] = (),
) -> spaces.Text:
    """The observation space of a (height, width) grid drawn with `symbols`, one line per row, cells joined by
    `separator`, in `observation_format` with coordinate lines named by `labels` (see `observation_text`)."""
    row_length = width + (width - 1) * len(separator)
    grid_length = (row_length + 1) * height
    if observation_format == "grid":
        return spaces.Text(max_length=grid_length, charset=symbols + separator + "\n")
    header = board_header(height, width)
    cell_length = len(f"({height - 1}, {width - 1}), ")
    # a bound, not the exact maximum: every label listing every cell
    coordinates_length = len(header) + sum(len(label) + 3 + height * width * cell_length for label in labels)
    charset = set(symbols + separator + "\n" + header + "".join(labels) + "0123456789(), :Grid")
    return spaces.Text(max_length=coordinates_length + len("Grid:\n") + grid_length, charset="".join(sorted(charset)))


def tile(background: tuple[int, int, int], shape: str = "full", color: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """One (TILE, TILE, 3) uint8 cell: a background with a centred `shape` in `color`.

    Shapes: "full" (background only), "square" (inset square), "ring" (inset square outline), "disc".
    """
    picture = np.empty((TILE, TILE, 3), dtype=np.uint8)
    picture[:] = background
    rows, cols = np.mgrid[:TILE, :TILE] + 0.5
    inset = TILE * 0.2
    inside = (rows > inset) & (rows < TILE - inset) & (cols > inset) & (cols < TILE - inset)
    if shape == "square":
        picture[inside] = color
    elif shape == "ring":
        border = TILE * 0.12
        core = (rows > inset + border) & (rows < TILE - inset - border) & (cols > inset + border) & (
            cols < TILE - inset - border
        )
        picture[inside & ~core] = color
    elif shape == "disc":
        picture[(rows - TILE / 2) ** 2 + (cols - TILE / 2) ** 2 < (TILE * 0.32) ** 2] = color
    else:
        assert shape == "full", f"unknown tile shape {shape!r}"
    return picture


def grid_to_rgb(grid: np.ndarray, tiles: dict[str, np.ndarray]) -> np.ndarray:
    """A (H, W) array of symbols drawn as a (H*TILE, W*TILE, 3) uint8 picture, one tile per cell."""
    symbols = sorted(tiles)
    ids = np.searchsorted(symbols, grid)  # (H, W) index of each cell's symbol
    stack = np.stack([tiles[s] for s in symbols])  # (K, TILE, TILE, 3)
    height, width = grid.shape
    return stack[ids].transpose(0, 2, 1, 3, 4).reshape(height * TILE, width * TILE, 3)


def shortest_path(
    start: State,
    successors: Callable[[State], Iterable[tuple[str, State]]],
    is_goal: Callable[[State], bool],
    max_states: int = 1_000_000,
) -> list[str] | None:
    """Breadth-first search: the shortest list of actions from `start` to a goal state, or None if none.

    `successors(state)` yields (action, next_state) pairs. Gives up with a RuntimeError after visiting
    `max_states` states, so a huge room cannot hang the caller.
    """
    parents: dict[State, tuple[State, str] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        if is_goal(state):
            path = []
            while parents[state] is not None:
                state, action = parents[state]
                path.append(action)
            return path[::-1]
        for action, next_state in successors(state):
            if next_state not in parents:
                parents[next_state] = (state, action)
                frontier.append(next_state)
        if len(parents) > max_states:
            raise RuntimeError(f"shortest_path visited more than {max_states} states without reaching a goal")
    return None


def reseed(env: gymnasium.Env, entropy: list[int]) -> None:
    """Set the env's random stream to a fresh one from `entropy`, in place: an env may hand its generator to
    an inner object (FrozenLake's gymnasium lake), which must see the change too."""
    generator = env.unwrapped.np_random
    generator.bit_generator.state = type(generator.bit_generator)(np.random.SeedSequence(entropy)).state


def start_episode(env: gymnasium.Env, seed: int, stream: list[int] | None) -> tuple[str, dict]:
    """`env.reset(seed=seed)`, then (unless `stream` is None) a fresh random stream from the entropy `stream`,
    so that environments sharing a start state (a group) play on with their own randomness. The one way an
    episode starts, in-process and on an environment server; a remote env takes both to its server."""
    if getattr(env, "starts_remotely", False):
        return env.reset(seed=seed, options={"stream": stream})
    observation, info = env.reset(seed=seed)
    if stream is not None:
        reseed(env, stream)
    return observation, info


PNG_PREFIX = "data:image/png;base64,"


def png_bytes(rgb: np.ndarray) -> bytes:
    """A (H, W, 3) uint8 picture as a PNG file: 8-bit RGB, no row filter, one zlib stream."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, width * 3)], axis=1)  # (H, 1 + 3W)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # bit depth 8, colour type 2 (RGB)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + \
        chunk(b"IEND", b"")


def png_uri(picture: np.ndarray) -> str:
    """An (H, W, 3) uint8 picture as a PNG data URI."""
    return PNG_PREFIX + base64.b64encode(png_bytes(picture)).decode("ascii")


def from_png(data: bytes) -> np.ndarray:
    """A PNG file (`png_bytes`) as the (H, W, 3) uint8 picture it holds."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
