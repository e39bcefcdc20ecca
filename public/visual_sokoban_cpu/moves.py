"""Per eval: success, moves that moved something, moves made by direction, and levels solved by move count."""
import collections, gzip, json, sys
for path in sys.argv[1:]:
    opener = gzip.open if path.endswith(".gz") else open
    rows = [json.loads(l) for l in opener(path, "rt")]
    moves, effective = collections.Counter(), [0, 0]
    for r in rows:
        for t in r["turns"]:
            for a, e in zip(t.get("actions", []), t.get("action_effective", [])):
                moves[a] += 1
                effective[0] += bool(e); effective[1] += 1
    solved = sum(bool(r["success"]) for r in rows)
    print(f"{path}: {solved}/{len(rows)} solved ({100*solved/len(rows):.1f} %), effective {100*effective[0]/max(1,effective[1]):.1f} %, moves {dict(moves)}")
