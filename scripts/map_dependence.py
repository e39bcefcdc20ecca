"""Does a FrozenLake policy read the map? `python scripts/map_dependence.py <trajectories.jsonl> [--recipe R] [key=value ...]`.

Reads greedy validation episodes (`ragen.eval`'s `trajectories.jsonl`, or a run's `rollouts/val/step_<N>.jsonl`),
rebuilds each episode's map from its tag and seed (the recipe's config with the same overrides), and prints:
- the policy's success against each constant move's exact success probability on the same maps (dynamic
  programming over the slip probabilities, within the tag's action budget) and the oracle's (value iteration);
- its success on the maps where the best constant move rarely reaches the goal (below `--blind-below`, 5 % by
  default; on slippery ice almost no map is out of its reach altogether), against that move's and the oracle's
  expected success on the same maps: a policy that does not read the map scores there what the move does;
- how its first answers spread over the maps (a blind policy gives one answer everywhere), beside the oracle's;
- how often its moves equal the oracle's at the cells it stood on;
- its expected success with the slips' luck taken out: the best success reachable within the action budget
  (finite-horizon dynamic programming) minus what each of its moves gave up at the cell and budget it was made
  in. Summed over an episode, that loss is an unbiased estimate of how far the policy's success probability lies
  below the best (the performance-difference identity; it holds for any policy, as the slips depend on the
  cell and move alone), and it varies far less from episode to episode than reaching the goal does.
`--against OTHER.jsonl` compares with another policy's episodes on the same maps (e.g. the same run's step 0): the
change in what the moves gave up, map by map, with its paired standard error. Files may be gzipped (`.gz`).
`--json PATH` also writes these figures.
"""

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

import numpy as np
from ragen.envs import make_env
from ragen.envs.frozen_lake import ACTION_WORDS, ACTIONS, FrozenLakeEnv, optimal_policy
from ragen.overrides import load_config

PLAYER_LINE = re.compile(r"Player: \((\d+), (\d+)\)")


def success_probability(table: dict, start: int, policy: np.ndarray, budget: int) -> float:
    """P(reaching the goal within `budget` actions from cell `start`) following `policy` (an action id per cell),
    on gymnasium's transition `table` of a map (`FrozenLakeEnv.lake.P`)."""
    reach = np.zeros(len(table))  # reach[s]: success probability from s with the actions left
    for _ in range(budget):  # one more action left each round
        reach = np.array([sum(p * (1.0 if reward > 0 else 0.0 if done else reach[s2])
                              for p, s2, reward, done in table[s][int(policy[s])]) for s in range(len(table))])
    return float(reach[start])


def action_values(table: dict, values_after: np.ndarray) -> np.ndarray:
    """(S, A): P(reaching the goal) for each first move, when `values_after[s2]` is the chance from s2 after it."""
    return np.array([[sum(p * (1.0 if reward > 0 else 0.0 if done else values_after[s2])
                          for p, s2, reward, done in table[s][a]) for a in range(len(ACTION_WORDS))]
                     for s in range(len(table))])


def best_action_values(table: dict, budget: int) -> np.ndarray:
    """(budget + 1, S, A): the chance of reaching the goal from each cell with k = 0 .. budget actions left, for each
    first move played best afterwards. Its max over the last axis is the best chance."""
    q = np.zeros((budget + 1, len(table), len(ACTION_WORDS)))
    for k in range(1, budget + 1):
        q[k] = action_values(table, q[k - 1].max(axis=1))
    return q


def success_given_up(turns: list[dict], q: np.ndarray, width: int, max_turn: int) -> float | None:
    """What an episode's moves gave up of the best chance of reaching the goal (`q` from `best_action_values`): per
    turn, the best value at the cell stood on with the actions left, minus the value of the move made (a turn without
    a valid move stays put and spends the turn). None when a turn made more than one move (the cells between them are
    not recorded)."""
    values = q.max(axis=2)
    budget, taken, lost = q.shape[0] - 1, 0, 0.0
    for t, turn in enumerate(turns):
        moves = [ACTIONS[a.strip().lower()] for a in turn["actions"] if a.strip().lower() in ACTIONS]
        cell = player_cell(turn["state"], width)
        if len(moves) > 1 or cell is None:
            return None
        left = min(max_turn - t, budget - taken)
        if moves:
            lost += values[left, cell] - q[left, cell, moves[0]]
            taken += 1
        else:
            lost += values[left, cell] - values[min(max_turn - t - 1, budget - taken), cell]
    return float(lost)


def player_cell(state: str, width: int) -> int | None:
    """The flattened cell the player stands on, from a state text's `Player: (r, c)` line or its grid."""
    match = PLAYER_LINE.search(state)
    if match:
        return int(match.group(1)) * width + int(match.group(2))
    grid = [line.replace(" ", "") for line in state.splitlines() if len(line.replace(" ", "")) == width]
    for r, line in enumerate(grid[-width:]):
        for c, symbol in enumerate(line):
            if symbol in "PX√":
                return r * width + c
    return None


def analyse(records: list[dict], recipe: str, overrides: list[str], blind_below: float = 0.05) -> dict:
    cfg = load_config(recipe, overrides)
    envs: dict[str, FrozenLakeEnv] = {}
    maps, rows = {}, []
    for record in records:
        tag = record["tag"]
        if tag not in envs:
            spec = cfg.custom_envs[tag]
            env = make_env(spec.env_type, dict(spec.env_config))
            if not isinstance(env.unwrapped, FrozenLakeEnv):
                raise SystemExit(f"{tag} is not a FrozenLake env: this script reads FrozenLake episodes only")
            envs[tag] = env
        env = envs[tag].unwrapped
        env.reset(seed=record["seed"])
        budget = cfg.custom_envs[tag].max_actions_per_traj
        horizon = min(budget, cfg.agent_proxy.max_turn)
        key = (tag, record["seed"])
        if key not in maps:  # the map's exact odds, on the transition table the env steps with
            table, start = env.lake.P, int(env.lake.s)  # just reset: the player is on the start
            oracle = optimal_policy(env.desc, env.config.is_slippery)
            constant = {word: success_probability(table, start, np.full(env.desc.size, a), budget)
                        for a, word in enumerate(ACTION_WORDS)}
            q = best_action_values(table, budget)
            maps[key] = {"constant": constant, "oracle": success_probability(table, start, oracle, budget),
                         "best": float(q[horizon, start].max()), "q": q,
                         "oracle_first": ACTION_WORDS[oracle[start]], "policy": oracle, "width": env.desc.shape[1]}
        info = maps[key]
        agree = total = 0
        for turn in record["turns"]:
            cell = player_cell(turn["state"], info["width"])
            for action in turn["actions"][:1]:  # the move made from the state shown
                if cell is not None and action in ACTION_WORDS:
                    total += 1
                    agree += action == ACTION_WORDS[info["policy"][cell]]
        first = next((turn["actions"][0] for turn in record["turns"] if turn["actions"]), None)
        lost = success_given_up(record["turns"], info["q"], info["width"], cfg.agent_proxy.max_turn)
        rows.append({"key": key, "success": bool(record["success"]), "first": first, "agree": agree, "moves": total,
                     "lost": None if record.get("env_error") else lost})

    constant_means = {word: float(np.mean([maps[row["key"]]["constant"][word] for row in rows])) for word in ACTION_WORDS}
    best = max(constant_means, key=constant_means.get)
    blind = [row for row in rows if maps[row["key"]]["constant"][best] < blind_below]
    firsts = collections.Counter(row["first"] for row in rows)
    oracle_firsts = collections.Counter(maps[row["key"]]["oracle_first"] for row in rows)
    moves = sum(row["moves"] for row in rows)
    lost = [row["lost"] for row in rows]
    expected = None if None in lost else [maps[row["key"]]["best"] - row["lost"] for row in rows]
    by_map = collections.defaultdict(list)
    for row in rows:
        by_map[f"{row['key'][0]}/{row['key'][1]}"].append(row["lost"])
    return {
        "episodes": len(rows), "maps": len(maps), "policy_success": float(np.mean([row["success"] for row in rows])),
        "constant_success": constant_means, "best_constant": best,
        "oracle_success": float(np.mean([maps[row["key"]]["oracle"] for row in rows])),
        "blind_below": blind_below, "episodes_best_constant_rarely_solves": len(blind),
        "there": {"policy": float(np.mean([row["success"] for row in blind])),
                  "best_constant": float(np.mean([maps[row["key"]]["constant"][best] for row in blind])),
                  "oracle": float(np.mean([maps[row["key"]]["oracle"] for row in blind]))} if blind else None,
        "first_answers": dict(firsts), "oracle_first_answers": dict(oracle_firsts),
        "first_answer_not_the_commonest": 1 - firsts.most_common(1)[0][1] / len(rows),
        "oracle_agreement": sum(row["agree"] for row in rows) / moves if moves else None,
        "policy_success_stderr": float(np.std([row["success"] for row in rows]) / np.sqrt(len(rows))),
        "best_success": float(np.mean([maps[row["key"]]["best"] for row in rows])),
        "success_given_up": None if expected is None else float(np.mean(lost)),
        "success_given_up_stderr": None if expected is None else float(np.std(lost) / np.sqrt(len(rows))),
        "expected_success": None if expected is None else float(np.mean(expected)),
        "expected_success_stderr": None if expected is None else float(np.std(expected) / np.sqrt(len(rows))),
        "given_up_by_map": None if expected is None else {key: float(np.mean(v)) for key, v in by_map.items()},
    }


def paired_change(figures: dict, baseline: dict) -> dict | None:
    """How much more (+) or less (-) success a policy's moves gave up than a baseline's, on the maps both played,
    compared map by map: {"maps", "change", "stderr"}; None when either has no slip-free estimate or no map is shared."""
    if figures["given_up_by_map"] is None or baseline["given_up_by_map"] is None:
        return None
    shared = sorted(set(figures["given_up_by_map"]) & set(baseline["given_up_by_map"]))
    if not shared:
        return None
    changes = [figures["given_up_by_map"][key] - baseline["given_up_by_map"][key] for key in shared]
    return {"maps": len(shared), "change": float(np.mean(changes)),
            "stderr": float(np.std(changes) / np.sqrt(len(changes)))}


def report(figures: dict) -> str:
    constant = ", ".join(f"{word} {share:.1%}" for word, share in figures["constant_success"].items())
    there = figures["there"]
    return "\n".join([
        f"{figures['episodes']} episodes on {figures['maps']} maps",
        f"policy success {figures['policy_success']:.1%} +- {figures['policy_success_stderr']:.1%}; "
        f"oracle {figures['oracle_success']:.1%} (expected); "
        f"constant moves (expected): {constant}",
        f"episodes on maps where {figures['best_constant']} (the best constant move) succeeds below "
        f"{figures['blind_below']:.0%}: {figures['episodes_best_constant_rarely_solves']}"
        + ("" if there is None else f"; there the policy {there['policy']:.1%}, {figures['best_constant']} "
           f"{there['best_constant']:.1%} and the oracle {there['oracle']:.1%} (expected)"),
        f"first answers: {figures['first_answers']} (oracle: {figures['oracle_first_answers']}); "
        f"{figures['first_answer_not_the_commonest']:.1%} of episodes open with another than the commonest",
        "moves equal to the oracle's at the cell stood on: "
        + ("-" if figures["oracle_agreement"] is None else f"{figures['oracle_agreement']:.1%}"),
        "expected success without the slips' luck: " + (
            "- (an episode made several moves in a turn, or its env failed)" if figures["expected_success"] is None else
            f"{figures['expected_success']:.1%} +- {figures['expected_success_stderr']:.1%} (the best within the "
            f"budget, {figures['best_success']:.1%}, minus what the moves gave up, {figures['success_given_up']:.1%} "
            f"+- {figures['success_given_up_stderr']:.1%})"),
    ])


def read_episodes(path: Path) -> list[dict]:
    """The episodes of a JSONL file, gzipped or not; exits with a message when it holds none."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    if not records:
        raise SystemExit(f"{path} holds no episodes")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trajectories", type=Path, help="a JSONL file of episodes (ragen.eval, or rollouts/val)")
    parser.add_argument("--recipe", default="frozen_lake", help="the recipe the episodes were played with")
    parser.add_argument("--blind-below", type=float, default=0.05,
                        help="maps where the best constant move's success probability is below this")
    parser.add_argument("--against", type=Path, help="another policy's episodes on the same maps, to compare with")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="the Hydra overrides the episodes were played with")
    args = parser.parse_intermixed_args()  # options may follow the key=value overrides
    figures = analyse(read_episodes(args.trajectories), args.recipe, args.overrides, args.blind_below)
    print(report(figures))
    if args.against:
        baseline = analyse(read_episodes(args.against), args.recipe, args.overrides, args.blind_below)
        figures["against"] = {"episodes": str(args.against), **(paired_change(figures, baseline) or {})}
        change = figures["against"]
        print(f"against {args.against}: " + ("- (no slip-free estimate on shared maps)" if "change" not in change else
              f"success given up {100 * change['change']:+.1f} +- {100 * change['stderr']:.1f} points (+: more "
              f"than there), map by map over {change['maps']} maps"))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
