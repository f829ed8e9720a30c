"""benchmarks/closed_book_lane.py runs end to end on a tiny model: both lanes answer the same questions alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_script_times_both_lanes_and_their_answers_are_equal(tmp_path):
    from fides_rag.testing import build_tiny_model, build_tokenizer

    folder = tmp_path / "tiny"
    tokenizer = build_tokenizer()
    build_tiny_model("llama", len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "lane.json"
    args = ["--backbone", str(folder), "--questions", "10", "--max-new-tokens", "4", "--in-flight", "5"]
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "closed_book_lane.py"),
            *args,
            "--fast-sample",
            "4",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.read_text())
    assert report["settings"]["questions"] == 10 and report["settings"]["dataset"] == "bigbench-conflicts"
    assert report["answers_equal"] == 10  # exact mode: an answer does not depend on what else is in flight
    assert report["batches"]["seconds"] > 0 and report["continuous"]["questions_per_second"] > 0
    assert report["fast"]["questions"] == 4 and 0 <= report["fast"]["equal_to_exact"] <= 4
