"""Issue 12's check of the library replacements: one run folder's statistics written by the old code (d91e4fd,
hand-written bootstrap, AUROC, quartiles) and by the new (scipy, sklearn, pandas) on the same predictions.

    fides-rag eval --model smollm2-135m-instruct --dataset nq-swap --limit 60 --methods standard,cad,adacad,fides \
        --max-new-tokens 16 --device cpu --out NEW --analyze
    cp -r NEW OLD && rm -r OLD/analysis OLD/results.*
    git worktree add /tmp/old d91e4fd
    (cd /tmp/old && FIDES_RAG_DATA=$PWD/../shared/data PYTHONPATH=/tmp/old python -m fides_rag.cli eval <same args> --out OLD --analyze)
    python compare.py NEW OLD          # the old code resumes: nothing is decoded again, only the statistics rewritten
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

new, old = Path(sys.argv[1]), Path(sys.argv[2])
n, o = (json.loads((p / "results.json").read_text()) for p in (new, old))
assert o["run"]["decoded_now"] == 0, "the old code decoded again: not the same predictions"
key = lambda c: (c["a"], c["b"], c["metric"])  # noqa: E731
old_tests = {key(c): c for c in o["significance"]}
pairs = [(c, old_tests[key(c)]) for c in n["significance"]]
report = {
    "examples": n["run"]["examples"],
    "metrics_identical": n["metrics"] == o["metrics"],
    "comparisons": len(pairs),
    "max_abs_change_diff": max(abs(a["diff"] - b["diff"]) for a, b in pairs),
    "max_abs_change_ci_bound": max(max(abs(a["ci_low"] - b["ci_low"]), abs(a["ci_high"] - b["ci_high"])) for a, b in pairs),
    "p_values_new_permutation_vs_old_bootstrap": [[list(key(a)), round(a["p_value"], 3), round(b["p_value"], 3)] for a, b in pairs],
    "analyses_identical": {f.name: json.loads(f.read_text()) == json.loads((old / "analysis" / f.name).read_text())
                           for f in sorted((new / "analysis").glob("*.json"))},
}
print(json.dumps(report, indent=2))
(Path(__file__).parent / "smollm2-nqswap-60.json").write_text(json.dumps(report, indent=2) + "\n")
