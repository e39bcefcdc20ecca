"""Separated-grid warm start vs grid_coord and plain grid, paired per level set."""
import gzip, json, glob
from math import comb
P = "/work/main/public/"
def load(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return {r["seed"]: bool(r["success"]) for r in map(json.loads, f)}
def mcnemar(a, b):
    assert a.keys() == b.keys()
    g = sum(b[s] and not a[s] for s in a); l = sum(a[s] and not b[s] for s in a)
    n, k = g + l, min(g, l)
    return g, l, (min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0)
sets = {"119": P + "sokoban_neighbours_cpu/warm_start_test_119000000x128.jsonl.gz",
        "113": P + "sokoban_rl_cpu/seed_2_test_113000000x128_before.jsonl.gz",
        "123": P + "sokoban_curriculum_cpu/seed_2_unused_123000000x128_before.jsonl.gz", "125": None}
tot = {"sep": [], "coord": [], "plain": []}
for s, coord in sets.items():
    path = glob.glob(f"/work/main/results/obs_sepgrid/test{s}/trajectories.jsonl")
    if not path: print(s, "not yet"); continue
    sep = load(path[0]); plain = load(P + f"sokoban_obs_grid_cpu/test_{s}000000x128.jsonl.gz")
    line = f"{s}M: sep {sum(sep.values())}/{len(sep)} ({100*sum(sep.values())/len(sep):.1f} %)"
    if coord:
        c = load(coord); g, l, p = mcnemar(c, sep); line += f" | coord {sum(c.values())} -> sep gained {g} lost {l} p={p:.3g}"
    g, l, p = mcnemar(plain, sep); line += f" | plain {sum(plain.values())} -> sep gained {g} lost {l} p={p:.3g}"
    print(line)
