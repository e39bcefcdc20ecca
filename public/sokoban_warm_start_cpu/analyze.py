"""Per-level outcomes of ragen.eval runs: greedy failures (loop kinds) and sampled groups (mixed = informative)."""
import json, sys, collections
def load(path):
    recs = [json.loads(l) for l in open(path)]
    by = collections.defaultdict(list)
    for r in recs: by[r["seed"]].append(r)
    return by
def loop_kind(r):
    turns = r["turns"]
    states = [t["state"] for t in turns]
    eff = [all(t.get("action_effective", [True])) for t in turns]
    if len(turns) >= 3 and not any(eff[-3:]): return "no-op repeat"
    if len(states) >= 4 and states[-1] == states[-3] and states[-2] == states[-4]: return "two-state oscillation"
    return "other"
greedy = load(sys.argv[1])
fails = {s: loop_kind(rs[0]) for s, rs in greedy.items() if not rs[0]["success"]}
print(f"greedy: {len(greedy) - len(fails)}/{len(greedy)} solved; failures: {collections.Counter(fails.values())}")
for path in sys.argv[2:]:
    sampled = load(path)
    succ = {s: sum(r["success"] for r in rs) for s, rs in sampled.items()}
    k = len(next(iter(sampled.values())))
    mixed = sum(0 < v < k for v in succ.values())
    tot = sum(succ.values()) / (k * len(succ))
    on_fail = [succ[s] for s in fails if s in succ]
    print(f"{path}: {k} per level, success {tot:.3f}, mixed groups {mixed}/{len(succ)}, "
          f"all-solved {sum(v == k for v in succ.values())}, none {sum(v == 0 for v in succ.values())}; "
          f"on greedy-failed levels: successes {on_fail} (levels with >=1: {sum(v > 0 for v in on_fail)}/{len(on_fail)})")
