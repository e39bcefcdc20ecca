"""Put seed 1's finished run back into a reproduce.py output folder, from what was published of it, so that
`scripts/reproduce.py frozen_lake --table --seeds 1 2 ...` tabulates it beside seed 2.

Seed 1's run folder (results/frozen_lake_crn/runs/seed_1) was lost with its workspace; what `--table` reads of a
finished run is its metrics.jsonl (published here as rl_seed1_metrics.jsonl) and its record
(`seed_1.reproduce.json`: the command, the wall time, the code, the test's success before and after, published in
public/results/frozen_lake_crn_cpu/results.json). Both are written back unchanged; nothing is re-measured.

    python public/frozen_lake_crn_cpu/restore_seed1.py results/frozen_lake_crn
"""

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from reproduce import bookkeeping, run_command  # noqa: E402

SEED = 1


def main(out: Path) -> None:
    published = json.loads((ROOT / "public/results/frozen_lake_crn_cpu/results.json").read_text(encoding="utf-8"))
    assert published["seeds"] == [SEED] and published["test"]["seeds"] == [SEED], "a record of seed 1 alone"
    run_dir = out.resolve() / "runs" / f"seed_{SEED}"
    done, _ = bookkeeping(run_dir)
    if done.exists() or run_dir.exists():
        sys.exit(f"{run_dir} already holds a run: nothing restored")
    run_dir.mkdir(parents=True)
    shutil.copyfile(HERE / f"rl_seed{SEED}_metrics.jsonl", run_dir / "metrics.jsonl")
    key = str(SEED)
    test = published["test"]
    overrides = [f"model_path={out.resolve() / 'runs' / f'warm_seed_{SEED}'}",
                 f"es_manager.val.env_groups={published['val_groups']}", *published["overrides"]]
    record = {"wall_time_s": published["wall_time_s"][key], "code": published["code"][key],
              "command": run_command(published["recipe"], SEED, run_dir, published["val_seed"], overrides),
              "test": {"test_seed": test["test_seed"], "test_groups": test["test_groups"],
                       **{name: {tag: row[name][0] for tag, row in test["success"].items()}
                          for name in ("before", "after")}},
              "restored_from": "public/results/frozen_lake_crn_cpu/results.json and "
                               f"public/frozen_lake_crn_cpu/rl_seed{SEED}_metrics.jsonl"}
    done.write_text(json.dumps(record), encoding="utf-8")
    print(f"restored seed {SEED}'s run record into {run_dir} and {done}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results/frozen_lake_crn")
