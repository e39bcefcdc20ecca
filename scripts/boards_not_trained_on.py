"""Does a policy read the board, or a format it has memorised? `python scripts/boards_not_trained_on.py <recipe>
<model> [--val-seed S] [--groups N] [--out DIR] [--boards NAME,...] [key=value ...]`

Evaluates <model> (anything `model_path=` takes: a model folder, a checkpoint, `reproduce.py --keep-model`'s
`runs/seed_<S>_model`) greedily with `ragen.eval`, as the trainer validates, on `--groups` start states from
`--val-seed`, first on the recipe's own board, then on boards it was not trained on:
- Sokoban: other grid symbols with the coordinates kept, `SokobanDifferentGridVocab` (other symbols, the plain
  grid, no coordinates), deeper levels (`search_depth` 100, 20 moves), and each other observation format;
- FrozenLake: each other observation format.
Beside each board: the reference agents on the same start states (random, best constant move, oracle; as
scripts/reproduce.py computes them), and for FrozenLake whether the moves depend on the map
(scripts/map_dependence.py: exact odds of the constant moves and the oracle, first answers, moves equal to the
oracle's).

Writes `<out>/<board>/` (ragen.eval's metrics.json, trajectories.jsonl and log), `<out>/results.json` and
`<out>/results.md`. A board already evaluated in `<out>` with the same model and overrides is read back, so an
interrupted call goes on where it stopped. Extra key=value overrides go to every board (give those the policy
was trained with).
The variants are the alternatives to the recipes' board (`observation_format: grid_coord`, cells separated).
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the sibling scripts below, also when this file is imported
from map_dependence import analyse  # noqa: E402
from reproduce import ROOT, code_version, evaluate, exit_on_sigterm, validation_baselines  # noqa: E402

from ragen.overrides import load_config  # noqa: E402


def boards(env_type: str, tag: str) -> dict[str, tuple[str, str, list[str]]]:
    """{name: (what the board shows, the tag played, its overrides)} for an env of `env_type` validated as `tag`."""
    env = f"++custom_envs.{tag}.env_config"
    shown = {"as_trained": ("as trained", tag, [])}
    if env_type == "sokoban":
        shown |= {
            "other_symbols": ("other symbols `W.T*BAa`, coordinates kept", tag, [f"{env}.symbols='W.T*BAa'"]),
            "different_grid_vocab": ("`SokobanDifferentGridVocab`: other symbols, plain grid, no coordinates",
                                     "SokobanDifferentGridVocab", []),
            "deeper": ("deeper levels: `search_depth` 100 (default 30), 20 moves (recipe 10)", tag,
                       [f"{env}.search_depth=100", f"custom_envs.{tag}.max_actions_per_traj=20",
                        "agent_proxy.max_turn=20"]),
        }
    elif env_type != "frozen_lake":
        raise SystemExit(f"boards not trained on are defined for sokoban and frozen_lake envs, not {env_type} ({tag})")
    return shown | {
        "grid": ("the grid of one token per cell alone (`observation_format=grid`)", tag,
                 [f"{env}.observation_format=grid"]),
        "coord": ("the coordinates alone (`observation_format=coord`)", tag, [f"{env}.observation_format=coord"]),
        "plain_grid": ("the plain grid (`grid`, cells not separated)", tag,
                       [f"{env}.observation_format=grid", f"{env}.cell_separator=''"]),
    }


def evaluate_board(recipe: str, model: str, folder: Path, overrides: list[str]) -> tuple[dict, str]:
    """(ragen.eval's metrics for `model` with `overrides`, in `folder`; the code they were measured with), read back
    if the same evaluation already ran there."""
    done = folder / "board.json"  # what wrote metrics.json: the model and overrides, and the code it ran
    asked = {"model": model, "overrides": overrides}
    if done.is_file() and {key: json.loads(done.read_text())[key] for key in asked} == asked:
        print(f"[boards] reusing {folder}", flush=True)
    else:  # none yet, or another evaluation's: evaluate anew
        done.unlink(missing_ok=True)
        (folder / "metrics.json").unlink(missing_ok=True)
    metrics = evaluate(recipe, [f"model_path={model}", *overrides], folder, folder / "eval.log")
    if not done.is_file():
        done.write_text(json.dumps(asked | {"code": code_version()}), encoding="utf-8")
    return metrics, json.loads(done.read_text())["code"]


def board_result(recipe: str, env_type: str, folder: Path, overrides: list[str], metrics: dict, code: str) -> dict:
    """One board's row: the policy's greedy figures and the reference agents on the same start states."""
    (tag,) = load_config(recipe, overrides).es_manager.val.env_configs.tags
    result = {key: metrics[f"val-env/{tag}/{key}"] for key in ("success", "valid_action_rate", "effective_action_rate")}
    result |= {"tag": tag, "overrides": overrides, "code": code,
               "reference": validation_baselines(recipe, overrides)[tag]}
    if env_type == "frozen_lake":
        records = [json.loads(line) for line in (folder / "trajectories.jsonl").read_text().splitlines() if line]
        result["map_dependence"] = analyse(records, recipe, overrides)
    return result


def pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


def markdown(summary: dict) -> str:
    frozen_lake = summary["env_type"] == "frozen_lake"
    lines = [f"# `{summary['model']}` on boards it was not trained on", "",
             f"Recipe `{summary['recipe']}`, greedy, {summary['groups']} start states from {summary['val_seed']:,}; "
             f"extra overrides: {summary['overrides'] or 'none'}; code {', '.join(summary['code'])}, "
             f"{summary['date']}. "
             "Success (%); the reference agents play one episode per start state"
             + (", the FrozenLake columns are exact expectations (scripts/map_dependence.py)." if frozen_lake else "."),
             ""]
    if frozen_lake:
        lines += ["| board shown | success | oracle (expected) | best constant (expected) | on maps the best constant "
                  "rarely solves: policy / oracle | moves equal to the oracle's | first answers other than the "
                  "commonest |", "|---|---|---|---|---|---|---|"]
    else:
        lines += ["| board shown | success | valid / effective actions | random | best constant | oracle |",
                  "|---|---|---|---|---|---|"]
    for row in summary["boards"].values():
        if frozen_lake:
            figures = row["map_dependence"]
            there = figures["there"]
            rarely = "-" if there is None else (f"{pct(there['policy'])} / {pct(there['oracle'])} "
                                                f"({figures['episodes_best_constant_rarely_solves']} maps)")
            best = figures["best_constant"]
            cells = [pct(row["success"]), pct(figures["oracle_success"]),
                     f"{best} {pct(figures['constant_success'][best])}", rarely, pct(figures["oracle_agreement"]),
                     pct(figures["first_answer_not_the_commonest"])]
        else:
            reference = row["reference"]
            constant = reference["constant"]
            cells = [pct(row["success"]), f"{pct(row['valid_action_rate'])} / {pct(row['effective_action_rate'])}",
                     pct(reference["random"]), "-" if constant is None else f"{constant[0]} {pct(constant[1])}",
                     pct(reference["oracle"])]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="the recipe the policy was trained with: sokoban, frozen_lake")
    parser.add_argument("model", help="the policy: a model folder or a checkpoint (what model_path= takes)")
    parser.add_argument("--val-seed", type=int, default=117_000_000,
                        help="first start state (seed); pick one no run or choice of yours has used")
    parser.add_argument("--groups", type=int, default=64, help="start states per board")
    parser.add_argument("--out", type=Path, help="output folder (default results/boards_<recipe>)")
    parser.add_argument("--boards", type=lambda names: names.split(","), metavar="NAME,NAME",
                        help="only these boards, comma-separated (default: all)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every board")
    args = parser.parse_intermixed_args()  # key=value overrides may follow the options
    out = (args.out or ROOT / "results" / f"boards_{args.recipe}").resolve()
    cfg = load_config(args.recipe, args.overrides)
    tag = cfg.es_manager.val.env_configs.tags[0]
    env_type = cfg.custom_envs[tag].env_type
    shown = boards(env_type, tag)
    unknown = set(args.boards or []) - set(shown)
    if unknown:
        raise SystemExit(f"unknown boards {sorted(unknown)}; {env_type} has {list(shown)}")
    results = {}
    for name, (label, played, board) in shown.items():
        if args.boards and name not in args.boards:
            continue
        overrides = [f"es_manager.val.env_configs.tags=[{played}]", f"es_manager.val.env_groups={args.groups}",
                     f"trainer.val_seed={args.val_seed}", *args.overrides, *board]
        metrics, code = evaluate_board(args.recipe, args.model, out / name, overrides)
        results[name] = {"label": label} | board_result(args.recipe, env_type, out / name, overrides, metrics, code)
        print(f"[boards] {label}: {pct(results[name]['success'])} %", flush=True)
    summary = {"recipe": args.recipe, "model": args.model, "env_type": env_type, "val_seed": args.val_seed,
               "groups": args.groups, "overrides": args.overrides,
               "code": sorted({row["code"] for row in results.values()}),  # each evaluation's, read back or not
               "date": time.strftime("%Y-%m-%d"), "boards": results}
    (out / "results.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (out / "results.md").write_text(markdown(summary), encoding="utf-8")
    print(markdown(summary) + f"\n[boards] written to {out}/results.md and results.json")


if __name__ == "__main__":
    main()
