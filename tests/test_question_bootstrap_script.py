"""benchmarks/question_bootstrap.py recomputes FIDES's differences over rows and over questions from run predictions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "question_bootstrap.py"


def _record(i: int, question: str, fides: float, standard: float) -> dict:
    outputs = {
        m: {"scores": {"cf": v, "em": v, "f1": v}, "steps": [], "new_tokens": 2, "text": "an answer", "method": m}
        for m, v in (("fides", fides), ("standard", standard))
    }
    return {"id": f"row-{i}", "question": question, "outputs": outputs}


def test_intervals_over_questions_are_wider_when_questions_repeat(tmp_path):
    run = tmp_path / "smollm2-nqswap-gated"
    run.mkdir()
    rows = [
        _record(5 * q + k, f"question {q}", float(q % 3 != 0), float(q % 2 == 0)) for q in range(12) for k in range(5)
    ]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    printed = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(tmp_path), "--samples", "500", "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report = json.loads(out.read_text())["runs"]
    assert [(r["backbone"], r["slice"], r["rows"], r["questions"]) for r in report] == [("135M", "conflict", 60, 12)]
    test = report[0]["comparisons"]["standard"]
    assert test["row"]["diff"] == pytest.approx(test["question"]["diff"]) == test["diff"]
    assert test["question"]["clusters"] == 12 and test["row"]["clusters"] is None
    row_width = test["row"]["ci_high"] - test["row"]["ci_low"]
    assert test["question"]["ci_high"] - test["question"]["ci_low"] > 1.5 * row_width
    assert "| 135M | conflict (CF) | 60 (12) | standard |" in printed
