"""Test seed 1's finished RL run (started before --test-seed existed) with reproduce.final_test, on its kept
last checkpoint, and record the result in the run's reproduce.json as the new code would have."""
import argparse, importlib.util, json, shutil, sys
from pathlib import Path
ROOT = Path("/work/main")
spec = importlib.util.spec_from_file_location("reproduce", ROOT / "scripts/reproduce.py")
r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
out = ROOT / "results/sokoban_cpu"
run_dir = out / "runs/seed_1"
done, _ = r.bookkeeping(run_dir)
record = json.loads(done.read_text())
kept = out / "kept_global_step_40"
if kept.exists():
    shutil.move(str(kept), str(run_dir / "global_step_40"))
extra = record["command"][record["command"].index(f"model_path={out / 'runs/warm_seed_1'}"):]
overrides = [o for o in extra if not o.startswith("es_manager.val.env_groups=")]
overrides = [overrides[0], "es_manager.val.env_groups=64", *overrides[1:]]
print(overrides)
args = argparse.Namespace(test_seed=int(sys.argv[1]), test_groups=int(sys.argv[2]))
record["test"] = r.final_test("sokoban", run_dir, args, overrides)
record["test_note"] = "tested after the run by reproduce.final_test on its kept last checkpoint (the run began before --test-seed)"
done.write_text(json.dumps(record))
shutil.rmtree(run_dir / "global_step_40")
print(record["test"])
