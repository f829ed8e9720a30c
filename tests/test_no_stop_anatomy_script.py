"""benchmarks/no_stop_anatomy.py on a committed strata run: its no_stop answers are those results.json counts, each
with one cause; the stop-aware variant never goes on past standard's end; an unknown method is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "no_stop_anatomy.py"
RUN = ROOT / "results" / "eval" / "qwen05-bigbench-strata"


def test_the_causes_account_for_every_no_stop_answer_results_json_counts(tmp_path):
    out = tmp_path / "anatomy.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(RUN), "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())["runs"][str(RUN)]
    counted = json.loads((RUN / "results.json").read_text())["strata"]["results"]
    for stratum, methods in report.items():
        for label, cell in methods.items():
            assert cell["rows"] == counted[stratum][label]["n"]
            assert cell["no_stop"] == counted[stratum][label]["failures"]["no_stop"] == sum(cell["causes"].values())
    assert sum(m["fides"]["causes"]["past_standard_end"] for m in report.values()) > 0  # the failure exists
    assert all(m["fides-stop"]["causes"]["past_standard_end"] == 0 for m in report.values())  # and the variant ends
    assert "| qwen05-bigbench-strata | true_conflict | fides-stop |" in done.stdout


def test_a_method_the_run_did_not_decode_is_refused():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(RUN), "--methods", "dola"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0 and "has no answers of dola; its methods are standard" in done.stderr
