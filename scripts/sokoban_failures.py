"""How greedy Sokoban episodes fail: `python scripts/sokoban_failures.py <episodes.jsonl[.gz]> [more ...]`.

Reads episode files as `ragen.eval` and the trainer's validation write them (one JSON object per episode, with its
`turns`), and sorts each failed episode by what its last `--last` turns (4 by default) did:
- `stuck`: one move, repeated, that changed nothing (a walk into a wall, a push against one): with the prompt
  holding only the current state, a greedy policy that gives it once gives it until the turns run out;
- `two-state walk`: the player went back and forth between two states;
- `other`: anything else (out of turns while still moving, a box pushed where it cannot be brought back).
It also prints the share of all moves that changed nothing, and how many levels were solved by the length of the
shortest solution (the BFS oracle's, from the first state's grid; levels drawn in other symbols are counted as
`unknown`). `--json PATH` writes the figures.
"""

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

from ragen.envs.sokoban import parse_room, solve

KINDS = ("stuck", "two-state walk", "other")


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


def shortest_solution(episode: dict) -> int | str:
    """The number of moves of the shortest solution from the episode's first state, or "unknown"."""
    lines = episode["turns"][0]["state"].split("\n")
    grid = lines[lines.index("Grid:") + 1:] if "Grid:" in lines else lines
    rows = []
    for line in grid:  # up to the first line that is not a row of cells (the columns view, the neighbours line)
        if ":" in line or not line.strip():
            break
        rows.append(line)
    try:
        plan = solve(*parse_room("\n".join(rows)))
    except ValueError:  # other symbols than the default legend
        return "unknown"
    return len(plan) if plan is not None else "unknown"


def summarize(episodes: list[dict], last: int) -> dict:
    failed = [episode for episode in episodes if not episode["success"]]
    kinds = {kind: [] for kind in KINDS}
    for episode in failed:
        kinds[failure_kind(episode, last)].append(episode["seed"])
    effective = [ok for episode in episodes for turn in episode["turns"] for ok in turn["action_effective"]]
    lengths = [shortest_solution(episode) for episode in episodes]
    order = sorted(set(lengths), key=lambda n: (isinstance(n, str), n))
    played, solved = Counter(lengths), Counter(n for n, episode in zip(lengths, episodes) if episode["success"])
    return {"episodes": len(episodes), "solved": len(episodes) - len(failed),
            "solved_by_shortest_solution": {str(n): [solved[n], played[n]] for n in order},
            "failed": {kind: len(seeds) for kind, seeds in kinds.items()},
            "failed_seeds": kinds, "noop_share": 1 - sum(effective) / max(len(effective), 1)}


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
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
