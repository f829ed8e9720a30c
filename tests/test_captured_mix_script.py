"""benchmarks/captured_mix.py runs end to end on a small mix and reports the warm-up's graphs and seconds, the decode
steps that ran eagerly and the answers equal to the eager decoder's; bad arguments are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "captured_mix.py"


def test_the_script_reports_graphs_eager_steps_and_equal_answers(tmp_path):
    out = tmp_path / "mix.json"
    args = ["--requests", "4", "--wave", "2", "--buckets", "1,2,4", "--max-prompt", "300", "--out", str(out)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["requests"] == 4 and report["failed"] == 0
    assert report["answers_equal_to_eager"] == 4
    assert report["decode_steps"] > 0 and report["eager_steps"] == 0 and report["graphs_after_warmup"] == 0
    assert report["warmup_graphs"] > 0 and report["warmup_s"] > 0
    assert report["prompt_tokens"]["max"] <= 300


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--wave", "0"], "--wave must be at least 1"),
        (["--min-new", "9", "--max-new", "3"], "--max-new must be at least --min-new"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_fix(args, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr
