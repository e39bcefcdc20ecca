"""How greedy Sokoban episodes fail: `python scripts/sokoban_failures.py <episodes.jsonl[.gz]> [more ...]`.

Reads episode files as `ragen.eval` and the trainer's validation write them (one JSON object per episode, with its
`turns`), and sorts each failed episode by what its last `--last` turns (4 by default) did:
- `stuck`: one move, repeated, that changed nothing (a walk into a wall, a push against one): with the prompt
  holding only the current state, a greedy policy that gives it once gives it until the turns run out;
- `two-state walk`: the player went back and forth between two states;
- `other`: anything else (out of turns while still moving, a box pushed where it cannot be brought back).
It also prints the share of all moves that changed nothing, and how many levels were solved by the length of the
shortest solution (the BFS oracle's, from the first state's grid; levels drawn in other symbols are counted as
`unknown`). And where each episode first left a shortest path (the oracle's moves to go, before and after each
turn): the share of turns that brought the level as many moves closer as they made, and each failed episode's first
mistake by kind:
- `no effect`: a move that changed nothing;
- `dead end`: a push after which no solution exists (a box in a corner);
- `detour`: the level still solvable, but further away than a shortest path would have left it;
with the turn it came on, the slack the level left (the turns it played, one move each, minus its shortest
solution) and whether its move headed at a box in a straight line; `none` if a failed episode never left a shortest
path (a level longer than the action budget).
`--json PATH` writes the figures.
"""

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np

from ragen.envs.sokoban import ACTIONS, Level, parse_room, solve

KINDS = ("stuck", "two-state walk", "other")
MISTAKES = ("no effect", "dead end", "detour", "none")


def read_episodes(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def failure_kind(episode: dict, last: int) -> str:
    turns = episode["turns"][-last:]
    moves = [tuple(turn["actions"]) for turn in turns]
    if len(set(moves)) == 1 and all(not any(turn["action_effective"]) for turn in turns):
        return "stuck"
    states = [turn["state"] for turn in turns]
    if len(set(states)) == 2 and all(a != b for a, b in zip(states, states[1:])):
        return "two-state walk"
    return "other"


def read_room(state: str) -> Level | None:
    """The room of an observation's grid; None if it is drawn in other symbols than the default legend."""
    lines = state.split("\n")
    grid = lines[lines.index("Grid:") + 1:] if "Grid:" in lines else lines
    rows = []
    for line in grid:  # up to the first line that is not a row of cells (the columns view, the neighbours line)
        if ":" in line or not line.strip():
            break
        rows.append(line)
    try:
        return parse_room("\n".join(rows))
    except ValueError:
        return None


def moves_to_go(state: str) -> int | None | str:
    """The number of moves of the shortest solution from an observation; None if it has none; "unknown" if it
    cannot be read (other symbols than the default legend)."""
    room = read_room(state)
    if room is None:
        return "unknown"
    plan = solve(*room)
    return len(plan) if plan is not None else None


def toward_box(state: str, move: str) -> bool:
    """Whether `move` takes the player closer to a box along the move's own axis (a straight line at the box)."""
    _, _, boxes, (row, col) = read_room(state)
    d_row, d_col = ACTIONS[move]
    return any((box_row - row) * d_row + (box_col - col) * d_col > 0 for box_row, box_col in np.argwhere(boxes))


def shortest_solution(episode: dict) -> int | str:
    """The number of moves of the shortest solution from the episode's first state, or "unknown"."""
    moves = moves_to_go(episode["turns"][0]["state"])
    return "unknown" if moves is None else moves


def path_turns(episode: dict) -> list[str] | str:
    """Each turn's verdict against the oracle's moves to go: "shortest" if it brought the level as many moves
    closer as it made, else the mistake's kind (see the module's docstring), up to the first dead end; "unknown"
    if a state cannot be read."""
    states = [turn["state"] for turn in episode["turns"]] + [episode["final_state"]]
    to_go = [moves_to_go(state) for state in states]
    if "unknown" in to_go:
        return "unknown"
    verdicts = []
    for index, turn in enumerate(episode["turns"]):
        before, after = to_go[index], to_go[index + 1]
        if before is None:
            break  # after a dead end nothing is on a path
        if after is not None and after == before - len(turn["actions"]):
            verdicts.append("shortest")
        elif not any(turn["action_effective"]):
            verdicts.append("no effect")
        else:
            verdicts.append("dead end" if after is None else "detour")
    return verdicts


def summarize(episodes: list[dict], last: int) -> dict:
    failed = [episode for episode in episodes if not episode["success"]]
    kinds = {kind: [] for kind in KINDS}
    for episode in failed:
        kinds[failure_kind(episode, last)].append(episode["seed"])
    effective = [ok for episode in episodes for turn in episode["turns"] for ok in turn["action_effective"]]
    lengths = [shortest_solution(episode) for episode in episodes]
    order = sorted(set(lengths), key=lambda n: (isinstance(n, str), n))
    played, solved = Counter(lengths), Counter(n for n, episode in zip(lengths, episodes) if episode["success"])
    verdicts = [path_turns(episode) for episode in episodes]
    mistakes = {}  # failed episode's seed -> its first mistake: {"turn", "kind", "slack"[, "toward_box"]}
    for episode, turns, length in zip(episodes, verdicts, lengths):
        if episode["success"] or turns == "unknown" or length == "unknown":
            continue
        turn = next((index for index, verdict in enumerate(turns) if verdict != "shortest"), None)
        first = {"turn": turn, "kind": "none", "slack": len(episode["turns"]) - length}
        if turn is not None:
            wrong = episode["turns"][turn]
            first |= {"kind": turns[turn], "toward_box": toward_box(wrong["state"], wrong["actions"][0])}
        mistakes[episode["seed"]] = first
    on_path = [verdict == "shortest" for turns in verdicts if turns != "unknown" for verdict in turns]
    return {"episodes": len(episodes), "solved": len(episodes) - len(failed),
            "solved_by_shortest_solution": {str(n): [solved[n], played[n]] for n in order},
            "failed": {kind: len(seeds) for kind, seeds in kinds.items()},
            "failed_seeds": kinds, "noop_share": 1 - sum(effective) / max(len(effective), 1),
            "shortest_path_share": sum(on_path) / max(len(on_path), 1),
            "first_mistake": {kind: sum(m["kind"] == kind for m in mistakes.values()) for kind in MISTAKES},
            "first_mistake_toward_box": sum(m.get("toward_box", False) for m in mistakes.values()),
            "first_mistakes": mistakes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("episodes", nargs="+", type=Path)
    parser.add_argument("--last", type=int, default=4, help="turns at the end of a failure that decide its kind")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.last < 2:
        parser.error("--last must be >= 2 (a walk between two states takes two turns)")
    figures = {}
    for path in args.episodes:
        summary = figures[str(path)] = summarize(read_episodes(path), args.last)
        kinds = ", ".join(f"{count} {kind}" for kind, count in summary["failed"].items())
        print(f"{path}: solved {summary['solved']} of {summary['episodes']}; failed: {kinds}; "
              f"moves that changed nothing: {100 * summary['noop_share']:.1f} %")
        by_length = ", ".join(f"{n}: {won}/{count}" for n, (won, count) in summary["solved_by_shortest_solution"].items())
        print(f"  solved by the shortest solution's moves: {by_length}")
        firsts = ", ".join(f"{count} {kind}" for kind, count in summary["first_mistake"].items())
        print(f"  turns on a shortest path: {100 * summary['shortest_path_share']:.1f} %; failures' first mistakes: {firsts}"
              f" ({summary['first_mistake_toward_box']} of them a move toward the box)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
