"""benchmarks/fast_agreement.py runs on a bundled backbone and writes, per method, how many answers fast mode decodes
equal to exact mode's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_agreement_script_counts_equal_answers_per_method(tmp_path):
    out = tmp_path / "agreement.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/fast_agreement.py",
            "--rows",
            "3",
            "--in-flight",
            "3",
            "--new-tokens",
            "6",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["rows"] == 3 and set(report["methods"]) == {"standard", "cad", "fides"}
    for method in report["methods"].values():
        assert 0 <= method["equal"] <= method["rows"] == 3
        assert len(method["first_differing_token"]) == 3 - method["equal"]
        assert method["max_alpha_gap_where_tokens_agree"] >= 0
    assert "fides: " in run.stdout
