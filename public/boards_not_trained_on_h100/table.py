"""The README's two tables, from the files in this folder: `python public/boards_not_trained_on_h100/table.py`.

evals/<env>_<board>_<levels>_metrics.json are `ragen.eval`'s metrics, reference_agents.json holds
scripts/reproduce.py's reference agents on the same start states (one episode each), map_dependence/ holds
`scripts/map_dependence.py --json` on the FrozenLake episodes (exact expected success of the constant moves and the
oracle on the same maps)."""

import json
from pathlib import Path

HERE = Path(__file__).parent
SOKOBAN = [("coord", "as trained: CoordSokoban (coordinates + grid of one token per cell)"),
           ("vocab", "other symbols `W.T*BAa`, coordinates kept"),
           ("vocabtag", "`SokobanDifferentGridVocab`: other symbols, plain grid, no coordinates"),
           ("deep", "`search_depth` 100 (recipe 30), 20 moves (recipe 10)"),
           ("grid", "the grid of one token per cell alone (`observation_format=grid`)"),
           ("coordonly", "the coordinates alone (`observation_format=coord`)"),
           ("plaingrid", "the plain grid (`grid`, no separator)")]
FROZEN_LAKE = [("coord", "as trained: CoordFrozenLake"), ("grid", "the grid of one token per cell alone"),
               ("coordonly", "the coordinates alone"), ("plaingrid", "the plain grid (no separator)")]


def success(env: str, board: str, levels: str) -> float:
    metrics = json.loads((HERE / "evals" / f"{env}_{board}_{levels}_metrics.json").read_text())
    return metrics["val/success_rate"]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def sokoban_table() -> str:
    refs = json.loads((HERE / "reference_agents.json").read_text())
    lines = ["| board shown | 97,000,000 | 98,000,000 | random | best constant | oracle |", "|---|---|---|---|---|---|"]
    for board, label in SOKOBAN:
        row = [pct(success("sok", board, levels)) for levels in ("97M", "98M")]
        key = board if board in ("deep", "vocabtag") else "coord"  # the other boards show the same levels
        agents = [next(iter(refs[f"sokoban/{key}/{seed}"].values())) for seed in (97000000, 98000000)]
        ref = [" / ".join(pct(a[name]) for a in agents) for name in ("random", "oracle")]
        constant = " / ".join(f"{a['constant'][0]} {pct(a['constant'][1])}" for a in agents)
        lines.append(f"| {label} | {row[0]} | {row[1]} | {ref[0]} | {constant} | {ref[1]} |")
    return "\n".join(lines)


def frozen_lake_table() -> str:
    lines = ["| board shown | success 95M / 96M | oracle expected | best constant expected | on maps the best constant "
             "rarely solves (policy / oracle) | moves equal to the oracle's | first answers other than the commonest |",
             "|---|---|---|---|---|---|---|"]
    for board, label in FROZEN_LAKE:
        runs = [json.loads((HERE / "map_dependence" / f"fl_{board}_{levels}.json").read_text())
                for levels in ("95M", "96M")]
        assert all(abs(r["policy_success"] - success("fl", board, lv)) < 1e-9 for r, lv in zip(runs, ("95M", "96M")))
        cells = [" / ".join(pct(r["policy_success"]) for r in runs),
                 " / ".join(pct(r["oracle_success"]) for r in runs),
                 " / ".join(f"{r['best_constant']} {pct(r['constant_success'][r['best_constant']])}" for r in runs),
                 " ; ".join(f"{pct(r['there']['policy'])} / {pct(r['there']['oracle'])} "
                            f"({r['episodes_best_constant_rarely_solves']} maps)" for r in runs),
                 " / ".join(pct(r["oracle_agreement"]) for r in runs),
                 " / ".join(pct(r["first_answer_not_the_commonest"]) for r in runs)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("Sokoban warm start, training seed 1, greedy success (%) on 64 levels from each first seed; reference "
          "agents on the same levels (97M / 98M)\n")
    print(sokoban_table())
    print("\nFrozenLake warm start, training seed 1, greedy on 64 maps from 95,000,000 / 96,000,000 (%)\n")
    print(frozen_lake_table())
