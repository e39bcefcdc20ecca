"""The states a model writes, read and scored against the environment's: VAGEN's world-model reward.

With `agent_proxy.reply_format=world_model` a reply copies the state it answers into
`<observation>…</observation>` and ends its thought with the state its actions lead to in
`<prediction>…</prediction>` (SPA, VAGEN). VAGEN (arXiv 2510.16907) rewards both spans turn by turn; here each
turn may earn, on top of the environment's reward,

    agent_proxy.world_model_reward.observation * credit(<observation>, the state the turn answered)
  + agent_proxy.world_model_reward.prediction  * credit(<prediction>, the state after the turn's actions)

with both weights 0 by default (no reward, nothing computed). `credit` is rule-based, for the grid
environments' text states (Sokoban, FrozenLake, any `observation_format`):
- `exact`: 1 when the span's text is the state's (outer whitespace ignored), else 0;
- `partial`: per-object credit. Where the true state has coordinate lines (`Player: (r, c)`, `Boxes: …`,
  `grid_coord` and `coord`), the share of coordinate labels, over those of both texts, whose cells the span gives
  exactly (a label the model adds or leaves out is wrong); a state without them (`grid`) is scored cell by cell:
  the share of grid cells with the true symbol at their row and column, over the larger of the two grids.
A reply without the span earns 0 for it; a malformed reply (no valid `<answer>`) is scored all the same, its
format penalty apart. Both credits are logged apart from the task reward
(`<split>/world_model/...`), and each turn's record keeps them. ragen/sft/world_model.py scores its held-out
predictions with the same parser (`score_state`).
"""

import re

from ragen.context_manager import OBSERVATION_CLOSE, OBSERVATION_OPEN, PREDICTION_CLOSE, PREDICTION_OPEN
from ragen.envs.frozen_lake import COORDINATE_LABELS as FROZEN_LAKE_LABELS
from ragen.envs.sokoban import COORDINATE_LABELS as SOKOBAN_LABELS

SPANS = {"observation": re.compile(f"{OBSERVATION_OPEN}(.*?){OBSERVATION_CLOSE}", re.DOTALL),
         "prediction": re.compile(f"{PREDICTION_OPEN}(.*?){PREDICTION_CLOSE}", re.DOTALL)}
CREDITS = ("exact", "partial")  # agent_proxy.world_model_reward.credit
# the labels of the coordinate lines of `observation_format: grid_coord | coord`, as the environments write them,
# longest first so that "Boxes on target" is not read as "Boxes"
COORDINATE_LABELS = tuple(sorted(set(SOKOBAN_LABELS) | set(FROZEN_LAKE_LABELS), key=lambda label: (-len(label), label)))
_COORDINATE_LINE = re.compile(rf"\s*({'|'.join(COORDINATE_LABELS)})\s*:(.*)")
_CELL = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def parse_state(text: str) -> tuple[list[str], dict[str, list[tuple[int, int]]]]:
    """(the lines that are not coordinate lines, right-stripped and without blank ones; each coordinate
    label's cells, sorted). A label written twice gets the cells of both lines."""
    lines, cells = [], {}
    for line in text.strip().splitlines():
        match = _COORDINATE_LINE.fullmatch(line)
        if match is None:
            if line.strip():
                lines.append(line.rstrip())
            continue
        found = [(int(r), int(c)) for r, c in _CELL.findall(match.group(2))]
        cells[match.group(1)] = sorted(cells.get(match.group(1), []) + found)
    return lines, cells


def score_state(written: str | None, true: str) -> dict:
    """How a state the model wrote (None: no span) matches the true one: `exact` text (outer whitespace
    ignored), `grid_exact` (the lines other than coordinate lines), and per coordinate label whether its cells
    are the true ones, over the labels of both texts (a label the model adds or leaves out is wrong);
    `coordinates_all` is None when the true state has no coordinate lines."""
    true_lines, true_cells = parse_state(true)
    lines, cells = parse_state(written) if written is not None else (None, {})
    labels = {label: cells.get(label) == true_cells.get(label) for label in set(true_cells) | set(cells)}
    return {"exact": written is not None and written.strip() == true.strip(), "grid_exact": lines == true_lines,
            "coordinates_all": all(labels.values()) if true_cells else None, "labels": labels}


def written_span(reply: str, kind: str) -> str | None:
    """The text of the first `<observation>` or `<prediction>` span of a reply, or None."""
    match = SPANS[kind].search(reply)
    return match.group(1) if match else None


def _grid_cells(lines: list[str]) -> list[list[str]]:
    """A grid's rows as lists of cells: one character a cell, whatever separates them (`cell_separator`)."""
    return [list("".join(line.split())) for line in lines]


def state_credit(written: str | None, true: str, credit: str) -> float:
    """The module docstring's credit in [0, 1] of a written state (None: no span) against the true one."""
    if written is None:
        return 0.0
    score = score_state(written, true)
    if credit == "exact":
        return float(score["exact"])
    if score["coordinates_all"] is not None:
        return sum(score["labels"].values()) / len(score["labels"])
    true_rows, rows = _grid_cells(parse_state(true)[0]), _grid_cells(parse_state(written)[0])
    size = max(sum(map(len, true_rows)), sum(map(len, rows)))
    right = sum(a == b for true_row, row in zip(true_rows, rows) for a, b in zip(true_row, row))
    return right / size if size else 1.0


def turn_credits(reply: str, state: str, next_state: str, credit: str) -> dict[str, float]:
    """{"observation": credit of the reply's <observation> against `state`, "prediction": of its <prediction>
    against `next_state`}."""
    return {kind: state_credit(written_span(reply, kind), true, credit)
            for kind, true in (("observation", state), ("prediction", next_state))}
