"""Paired comparison of greedy Sokoban episodes on the same levels: gained / lost and the exact McNemar p."""
import gzip, json, sys
from math import comb

def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return {r["seed"]: bool(r["success"]) for r in map(json.loads, f)}

def mcnemar(b, c):
    n, k = b + c, min(b, c)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0

new = load(sys.argv[1])
for other in sys.argv[2:]:
    old = load(other)
    assert old.keys() == new.keys(), "different levels"
    gained = sum(new[s] and not old[s] for s in new); lost = sum(old[s] and not new[s] for s in new)
    print(f"{sys.argv[1]}: {sum(new.values())}/{len(new)} vs {other}: {sum(old.values())}/{len(old)}; "
          f"gained {gained}, lost {lost}, p = {mcnemar(gained, lost):.3f}")
