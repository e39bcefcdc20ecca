"""Were the held-out boards among the training boards? `python scripts/seen_boards.py EPISODES... --recipe R
--train-seeds 0:2000 [key=value ...]`.

Held-out start states come from seeds that no run trained on, but small boards repeat across seeds: the 2,000
seeds of the laptop Sokoban warm start hold 1,569 distinct 6×6 levels, and 30 % of 128 levels drawn from another
seed range are among them (the 16,000 of the default warm start: 7,111 levels, 74 %); the 2,000 of FrozenLake's
warm start hold 733 distinct 4×4 maps, and 77 % of 128 held-out maps. A seed-disjoint test then measures recall
as much as reading the board. This script rebuilds each tag's start boards at the training seeds
(`env.reset(seed)` with the recipe's env config and the overrides given, so the text is the one the episodes
were played on) and splits every episode file's greedy success into the boards seen in training and those not
seen, beside the scripted oracle's success on the same start states (a board that repeats is a common one, and
may be easier). FrozenLake episodes get instead their expected success without the slips' luck and the best odds
(`scripts/map_dependence.py`) on each part; Sokoban episodes also their success by the moves of the start board's
shortest solution, since the boards that repeat are mostly the short ones.

The training seeds are those of the training data: the warm start's expert episodes (`ragen.sft.data`'s
`--seed` onwards, 0 .. `--train-size` by default) and RL's start states (`trainer.seed + step × env_groups +
group`, inside the first range for the recipes here). Give one `--train-seeds START:END` per range.
Files may be gzipped (`.gz`); `--json PATH` also writes the figures.

`--pick-unseen SEED --groups N` instead prints the overrides of a test on N boards that none of the training seeds
saw, each board once (`es_manager.val.seeds=[...] es_manager.val.env_groups=N`, for `python -m ragen.eval`);
`scripts/reproduce.py --test-new-boards` tests on such boards.
"""

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np

from ragen.envs import make_env
from ragen.envs.baselines import OracleAgent, evaluate, has_oracle
from ragen.envs.boards import new_board_seeds, start_board, start_boards
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.sokoban import SokobanEnv, solve_env
from ragen.overrides import load_config

_spec = importlib.util.spec_from_file_location("map_dependence", Path(__file__).with_name("map_dependence.py"))
map_dependence = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(map_dependence)


def seed_range(text: str) -> range:
    start, _, end = text.partition(":")
    try:
        seeds = range(int(start), int(end))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not START:END (e.g. 0:2000)") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} holds no seed")
    return seeds


def tag_env(cfg, tag: str):
    spec = cfg.custom_envs[tag]
    return make_env(spec.env_type, dict(spec.env_config))


def training_boards(cfg, tags: set[str], train_seeds) -> dict[str, set[str]]:
    """Per tag, the start observations of every training seed (`train_seeds`: iterables of seeds)."""
    return {tag: start_boards(tag_env(cfg, tag), (seed for seeds in train_seeds for seed in seeds))
            for tag in sorted(tags)}


def pick_unseen(cfg, boards: dict[str, set[str]], start: int, groups: int, tries: int = 1000) -> list[int]:
    """Start seeds for a test on boards no run saw: for each of `groups` validation groups (tags as
    es_manager.val splits them), the next seed from `start` on whose start board is neither among its tag's
    `boards` (from `training_boards`) nor an earlier pick's, so that every board is new and played once. For
    `es_manager.val.seeds`. The boards left are the rarer ones: compare with the oracle's success on them."""
    tags = cfg.es_manager.val.env_configs.group_tags(groups)
    return new_board_seeds(tags, {tag: tag_env(cfg, tag) for tag in tags}, start, boards, tries)


def split_by_seen(records: list[dict], cfg, boards: dict[str, set[str]]) -> dict[str, list[dict]]:
    """The episodes whose start board is among the training boards of their tag, and the others."""
    envs, parts = {}, {"seen": [], "unseen": []}
    for record in records:
        env = envs.setdefault(record["tag"], tag_env(cfg, record["tag"]))
        start = start_board(env, record["seed"])
        parts["seen" if start in boards[record["tag"]] else "unseen"].append(record)
    return parts


def success_by_part(parts: dict[str, list[dict]]) -> dict[str, dict]:
    """{part: {"episodes", "success"}}: the share of each part's episodes that succeeded (None: no episode)."""
    return {name: {"episodes": len(part), "success": sum(bool(r["success"]) for r in part) / len(part) if part else None}
            for name, part in parts.items()}


def oracle_success(records: list[dict], cfg) -> float | None:
    """The scripted oracle's success on the episodes' start states, one episode each (None: an env without one)."""
    solved = 0.0
    for tag in sorted({record["tag"] for record in records}):
        env = tag_env(cfg, tag)
        if not has_oracle(env):
            return None
        seeds = [record["seed"] for record in records if record["tag"] == tag]
        solved += evaluate(env, OracleAgent(), seeds, cfg.custom_envs[tag].max_actions_per_traj).success_rate * len(seeds)
    return solved / len(records)


def by_solution_length(records: list[dict], cfg) -> dict[str, dict]:
    """Sokoban: {moves of the start board's shortest solution ("none": no solution): {"episodes", "success"}}, to
    tell difficulty from recall: the boards that repeat across seeds are mostly the short ones."""
    envs, lengths = {}, {}
    for record in records:
        env = envs.setdefault(record["tag"], tag_env(cfg, record["tag"]))
        env.reset(seed=record["seed"])
        plan = solve_env(env.unwrapped)
        lengths.setdefault("none" if plan is None else str(len(plan)), []).append(record)
    return {length: success_by_part({"all": part})["all"]
            for length, part in sorted(lengths.items(), key=lambda item: float(item[0].replace("none", "inf")))}


def figures(records: list[dict], cfg, recipe: str, overrides: list[str], boards: dict[str, set[str]]) -> dict:
    """Success on the boards seen in training (`boards`, from `training_boards`) and on the others, beside the
    oracle's (FrozenLake: the slip-free expected success and the best odds; Sokoban: also by the length of the
    shortest solution)."""
    tags = {record["tag"] for record in records}
    parts = split_by_seen(records, cfg, boards)
    result = {"episodes": len(records), "training_boards": {tag: len(boards[tag]) for tag in sorted(tags)}}
    lake = all(isinstance(tag_env(cfg, tag).unwrapped, FrozenLakeEnv) for tag in tags)
    sokoban = all(isinstance(tag_env(cfg, tag).unwrapped, SokobanEnv) for tag in tags)
    for name, stats in success_by_part(parts).items():
        result[name] = stats
        if lake and parts[name]:  # the oracle's exact odds among them
            slip_free = map_dependence.analyse(parts[name], recipe, overrides)
            result[name] |= {key: slip_free[key] for key in ("expected_success", "expected_success_stderr",
                                                             "best_success", "oracle_success")}
        elif parts[name]:
            result[name]["oracle_success"] = oracle_success(parts[name], cfg)
        if sokoban and parts[name]:
            result[name]["by_solution_length"] = by_solution_length(parts[name], cfg)
    return result


def report(path: Path, result: dict) -> str:
    def part(name: str) -> str:
        stats = result[name]
        if not stats["episodes"]:
            return "none"
        text = f"{stats['episodes']}, {stats['success']:.1%} solved"
        if stats.get("expected_success") is not None:
            text += (f" ({stats['expected_success']:.1%} +- {stats['expected_success_stderr']:.1%} expected without"
                     f" the slips' luck, the best {stats['best_success']:.1%})")
        elif stats.get("oracle_success") is not None:
            text += f" (the oracle {stats['oracle_success']:.1%})"
        return text
    def lengths(name: str) -> str:
        rows = result[name].get("by_solution_length", {})
        return ", ".join(f"{moves}: {round(row['success'] * row['episodes'])}/{row['episodes']}" for moves, row in rows.items())
    text = (f"{path}: {result['episodes']} episodes; on boards seen in training {part('seen')}; on boards not seen "
            f"{part('unseen')}")
    if any("by_solution_length" in result[name] for name in ("seen", "unseen")):
        text += (f"\n  solved by the moves of the shortest solution: seen {lengths('seen') or 'none'}; not seen "
                 f"{lengths('unseen') or 'none'}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="*", metavar="EPISODES|key=value",
                        help="JSONL files of episodes (ragen.eval, rollouts/val), and the Hydra overrides they were "
                        "played with (key=value)")
    parser.add_argument("--recipe", required=True, help="the recipe the episodes were played with")
    parser.add_argument("--train-seeds", type=seed_range, action="append", required=True, metavar="START:END",
                        help="a range of training seeds (repeat for several)")
    parser.add_argument("--json", type=Path, help="also write the figures here, one entry per file")
    parser.add_argument("--pick-unseen", type=int, metavar="SEED",
                        help="instead of splitting episodes, print the overrides of a test on boards none of the "
                        "training seeds saw, each once: es_manager.val.seeds from SEED on (--groups of them)")
    parser.add_argument("--groups", type=int, default=64, help="with --pick-unseen: validation groups, all tags")
    args = parser.parse_intermixed_args()
    args.overrides = [item for item in args.items if "=" in item]
    args.episodes = [Path(item) for item in args.items if "=" not in item]
    if (args.pick_unseen is None) == (not args.episodes):
        parser.error("give episode files, or --pick-unseen SEED")
    if args.pick_unseen is not None:
        cfg = load_config(args.recipe, args.overrides)
        boards = training_boards(cfg, set(cfg.es_manager.val.env_configs.tags), args.train_seeds)
        seeds = pick_unseen(cfg, boards, args.pick_unseen, args.groups)
        print(f"es_manager.val.seeds=[{','.join(map(str, seeds))}] es_manager.val.env_groups={len(seeds)}")
        return
    episodes = {path: map_dependence.read_episodes(path) for path in args.episodes}
    cfg = load_config(args.recipe, args.overrides)
    boards = training_boards(cfg, {record["tag"] for records in episodes.values() for record in records},
                             args.train_seeds)
    results = {}
    for path, records in episodes.items():
        results[str(path)] = figures(records, cfg, args.recipe, args.overrides, boards)
        print(report(path, results[str(path)]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
