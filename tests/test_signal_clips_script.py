"""benchmarks/signal_clips.py counts each signal's tokens at its clip and alpha's range per method of a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _step(alpha: float, noise: float | None = None) -> dict:
    step = {"token": "x", "token_id": 1, "alpha": alpha, "opposition": 0.2, "shift": 0.01}
    return step if noise is None else {**step, "noise": noise}


def test_the_script_reports_clip_shares_and_alpha_quartiles_per_method(tmp_path):
    record = {
        "id": "r1",
        "question": "q",
        "outputs": {
            "standard": {"text": "a", "steps": [{"token": "a", "token_id": 2}]},
            "fides": {"text": "b", "steps": [_step(0.3, 1.0), _step(0.5, 1.0), _step(0.7, 0.4), _step(0.9, 1.0)]},
            "fides-calibrated": {"text": "b", "steps": [_step(0.2, 0.1), _step(0.4, 0.3)]},
        },
    }
    (tmp_path / "predictions.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "clips.json"
    script = ROOT / "benchmarks" / "signal_clips.py"
    subprocess.run([sys.executable, str(script), str(tmp_path), "--out", str(out)], check=True, capture_output=True)
    methods = json.loads(out.read_text())["methods"]
    assert set(methods) == {"fides", "fides-calibrated"}  # standard records no alpha
    assert methods["fides"]["noise"] == {"at_clip": 0.75, "median": 1.0} and methods["fides"]["tokens"] == 4
    assert methods["fides"]["alpha_quartiles"] == [0.45, 0.6, 0.75]
    assert methods["fides-calibrated"]["noise"]["at_clip"] == 0.0
    refused = subprocess.run([sys.executable, str(script), str(tmp_path / "none")], capture_output=True, text=True)
    assert refused.returncode == 2 and "holds no predictions.jsonl" in refused.stderr
