"""Write the results tables of README.md and docs/recipes-and-results.md from the committed reproductions.

    python scripts/results_table.py          # rewrites both tables
    python scripts/results_table.py --check  # exits 1 when a table differs from what the results say

A reproduction is published by copying what `scripts/reproduce.py` wrote into `public/results/<name>/`
(`results.json`, and `curve.png` for the figure); `<name>` is the recipe, or the recipe and a variant
(`sokoban_warm_start`). Each validation tag of each `results.json` is one row: the model RL started from and the
trained one on the runs' validation start states, or on its test levels when it has them (`reproduce.py
--test-seed`: levels kept aside from every run and choice), the reference agents on those same states (one episode
each, as the policy), RAGEN's published number, and how the row was measured. A reproduction made with
`--warm-start` starts from each seed's warm start, so its "start" holds the warm starts' scores (their mean and
each seed's) and its row says so. A recipe of train.sh with no
published reproduction gets a row that says so. The tables sit between the markers below; the rest of each
file is left as it is, and tests/test_docs.py fails when a table is stale.

The Sokoban ablation table (docs/recipes-and-results.md) is written the same way from `public/ablation.json`: one
line per lever setting, each naming the folder of its `results.json` under `public/` and which model it reads
(`before`: the run's start, `after`: its end) on which levels (`test`: the test start states of
`reproduce.py --test-seed`, `val`: the validation ones), or naming the episode files of a lab's `python -m ragen.eval`
runs (`episodes`: one `*.jsonl.gz` under `public/` per seed, all on the same levels; `machine`: where they ran), so
every number in it is one that was measured.
"""

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "public" / "results"
BEGIN = "<!-- results table: written by scripts/results_table.py from public/results/*/results.json -->"
END = "<!-- end of results table -->"
DETAILS = {"README.md": "docs/recipes-and-results.md#results", "docs/recipes-and-results.md": "#results"}
# RAGEN's published success rates (Qwen2.5-0.5B; see the research notes), per validation tag
PAPER = {"Bandit": "100 %", "BanditTest": "100 %", "FrozenLake": "21.8 % (StarPO-S)", "CoordFrozenLake": "21.8 % (StarPO-S)",
         "CoordSokoban": "20.3 % (RL), 74.6 % (SFT)", "SimpleSokoban": "20.3 % (RL), 74.6 % (SFT)"}
RECIPES = ["bandit", "frozen_lake", "sokoban", "countdown"]  # train.sh's recipes, in the README's order
ABLATION_FILE = "docs/recipes-and-results.md"
ABLATION_BEGIN = "<!-- ablation table: written by scripts/results_table.py from public/ablation.json -->"
ABLATION_END = "<!-- end of ablation table -->"
LEVERS = ["observation", "warm start", "RL", "filter", "curriculum", "other"]  # the columns ablation.json names


def percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def load_results(folder: Path) -> dict[str, dict]:
    """{name: results.json} for every published reproduction, by name."""
    return {path.parent.name: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(folder.glob("*/results.json"))}


def reported(result: dict) -> tuple[dict, dict, list[int], str]:
    """The success by tag, the reference agents by tag, the seeds and the levels a results.json is reported on: its
    test levels if it has them (`reproduce.py --test-seed`: kept aside from every run and choice), else the
    validation states the runs were watched on."""
    test = result.get("test")
    if test:
        return (test["success"], test["baselines"], test["seeds"],
                f"{test['test_groups']} test states from seed {test['test_seed']} (kept aside"
                + (", boards no run saw)" if test.get("new_boards") else ")"))
    return result["val_success"], result["baselines"], result["seeds"], \
        f"{result['val_groups']} states from seed {result['val_seed']}"


def measured_row(name: str, tag: str, result: dict, details: str) -> str:
    success, baselines, seeds, levels = reported(result)
    row, base = success[tag], baselines[tag]
    trained = f"**{percent(row['after_mean'])}**" + (f" ± {100 * row['after_std']:.1f}" if len(seeds) > 1 else "")
    per_seed = ", ".join(percent(v) for v in row["after"])
    # the start: the untrained model (one value, the same for every seed), or each seed's warm start (in seed order)
    before = percent(row["before"][0]) if len(set(row["before"])) == 1 else \
        (f"{percent(statistics.mean(row['before']))} ± {100 * statistics.stdev(row['before']):.1f} "
         f"({', '.join(percent(v) for v in row['before'])})")
    constant = f"{percent(base['constant'][1])} ({base['constant'][0]})" if base["constant"] else "—"
    oracle = "—" if base["oracle"] is None else percent(base["oracle"])
    steps = "/".join(map(str, sorted(set(result["steps"].values()))))
    # with --warm-start, "before" is each seed's warm start (sft/warm_start.sh), not the untrained model
    rl = f"{steps} step{'s' if steps != '1' else ''}" if steps != "0" else "no RL step validated"
    if result.get("interrupted"):
        rl += f" (runs of seeds {', '.join(map(str, result['interrupted']))} stopped early)"
    runs = f"warm start ({' '.join(result['warm_start_args']) or 'defaults'}) + RL, {rl}" \
        if result.get("warm_start") else rl
    how = (f"`{name}`: {len(seeds)} seed{'s' if len(seeds) != 1 else ''}, {runs}, {levels}; {result['model'].rsplit('/', 1)[-1]}, "
           f"{result['machine']}, {result['date']} ([details]({details}))")
    after = f"{trained} ({per_seed})" if steps != "0" else "— (no RL step validated)"
    return (f"| {tag} | {before} → {after} | {percent(base['random'])} | {constant} | {oracle} | "
            f"{PAPER.get(tag, '—')} | {how} |")


def table(results: dict[str, dict], details: str) -> str:
    lines = ["| environment | start → after RL (mean ± std over seeds; per seed) | random | best constant move "
             "| oracle | RAGEN paper (Qwen2.5-0.5B) | measured |", "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        lines += [measured_row(name, tag, result, details) for tag in reported(result)[0]]
    published = {result["recipe"] for result in results.values()}
    for recipe in RECIPES:
        if recipe not in published:
            lines.append(f"| `{recipe}` | no published reproduction yet: earlier runs are in the "
                         f"[lab notes]({details.split('#')[0]}#lab-notes) | | | | | |")
    return "\n".join(lines)


def ablation_table(spec: dict, published: Path) -> str:
    """One line per entry of `spec["lines"]`: its levers, then the greedy success it measured, mean and per seed:
    from a results.json (the named model, `before` | `after`, on the named levels, `test` | `val`) or from episode
    files (one per seed)."""
    lines = [f"| {' | '.join(LEVERS)} | levels | greedy success (per seed) | measured |",
             "|" + "---|" * (len(LEVERS) + 3)]
    for entry in spec["lines"]:
        read = episodes_line if "episodes" in entry else results_line
        levels, scores, measured = read(entry, published)
        per_seed = ", ".join(percent(v) for v in scores)
        spread = f" ± {100 * statistics.stdev(scores):.1f}" if len(scores) > 1 else ""  # the sample std, as reproduce.py's
        levers = " | ".join(entry.get(lever, "—").replace("|", "\\|") for lever in LEVERS)
        lines.append(f"| {levers} | {levels} | **{percent(statistics.mean(scores))}**{spread} ({per_seed}) | {measured} |")
    return "\n".join(lines)


def results_line(entry: dict, published: Path) -> tuple[str, list[float], str]:
    unknown = entry.keys() - {*LEVERS, "results", "model", "levels", "tag"}
    if unknown or entry.get("model") not in ("before", "after") or entry.get("levels") not in ("test", "val"):
        sys.exit(f"ablation line {entry}: the keys are {', '.join(LEVERS)}, results, tag, model (before | after) "
                 f"and levels (test | val), or episodes and machine"
                 f"{'; unknown: ' + ', '.join(sorted(unknown)) if unknown else ''}")
    result = json.loads((published / entry["results"] / "results.json").read_text(encoding="utf-8"))
    test = entry["levels"] == "test"
    if test and "test" not in result:
        sys.exit(f"ablation line {entry}: public/{entry['results']}/results.json has no test (reproduce.py --test-seed)")
    seed, groups = ((result["test"]["test_seed"], result["test"]["test_groups"]) if test
                    else (result["val_seed"], result["val_groups"]))
    row = (result["test"]["success"] if test else result["val_success"])[entry["tag"]]
    new = " on boards no run saw" if test and result["test"].get("new_boards") else ""
    return (f"{groups} from {seed:,}{new}", row[entry["model"]],
            f"`public/{entry['results']}/`, {entry['model']}; {result['machine']}")


def episodes_line(entry: dict, published: Path) -> tuple[str, list[float], str]:
    """Success per seed from `python -m ragen.eval` episode records (`*.jsonl.gz`), which must cover the same levels."""
    unknown = entry.keys() - {*LEVERS, "episodes", "machine"}
    if unknown or "machine" not in entry or not entry["episodes"]:
        sys.exit(f"ablation line {entry}: an episodes line has the keys {', '.join(LEVERS)}, episodes (one file per "
                 f"seed) and machine{'; unknown: ' + ', '.join(sorted(unknown)) if unknown else ''}")
    scores, level_sets = [], set()
    for name in entry["episodes"]:
        with gzip.open(published / name, "rt", encoding="utf-8") as file:
            records = [json.loads(line) for line in file]
        scores.append(sum(bool(record["success"]) for record in records) / len(records))
        level_sets.add(tuple(sorted(record["seed"] for record in records)))
    if len(level_sets) != 1:
        sys.exit(f"ablation line {entry}: its episode files were played on different levels")
    levels = level_sets.pop()
    files = ", ".join(f"`public/{name}`" for name in entry["episodes"])
    return f"{len(levels)} from {levels[0]:,}", scores, f"{files}; {entry['machine']}"


def rewrite(text: str, new_table: str, name: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{name}: needs exactly one {begin!r} and one {end!r} line around its table")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{new_table}\n{end}{rest.split(end)[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    results, stale = load_results(RESULTS), []
    for name, details in DETAILS.items():
        path = ROOT / name
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, table(results, details), name)
        if name == ABLATION_FILE:
            spec = ROOT / "public" / "ablation.json"
            ablation = ablation_table(json.loads(spec.read_text(encoding="utf-8")), spec.parent)
            new = rewrite(new, ablation, name, ABLATION_BEGIN, ABLATION_END)
        if new != text:
            stale.append(name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        sys.exit(f"stale results table in {', '.join(stale)}: run python scripts/results_table.py")
    print(f"{'stale' if args.check else 'rewrote'}: {', '.join(stale)}" if stale
          else "the results tables are up to date")


if __name__ == "__main__":
    main()
