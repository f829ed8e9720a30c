"""benchmarks/scale_trend.py reads the eval runs' results.json and prints the scale-trend tables with n and CIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scale_trend.py"


def _results(examples: int, metrics: dict[str, dict[str, float | None]], significance: list[dict]) -> dict:
    filled = {m: {"cf": None, "accuracy": None, "memorized": None, "em": None, **v} for m, v in metrics.items()}
    return {"run": {"examples": examples}, "metrics": filled, "significance": significance, "labels": list(metrics)}


def _write(root: Path, run: str, results: dict) -> None:
    (root / run).mkdir(parents=True)
    (root / run / "results.json").write_text(json.dumps(results))


def _run(root: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


def test_gates_table_gives_each_methods_differences_with_cis_and_labels_small_n(tmp_path):
    conflict = _results(
        40,
        {
            "standard": {"cf": 50.0},
            "adacad": {"cf": 55.0},
            "fides": {"cf": 60.0, "share_contrasted": 100.0},
            "fides+agree": {"cf": 52.0, "share_contrasted": 7.5},
        },
        [
            {"a": "standard", "b": "fides", "metric": "cf", "diff": -10.0, "ci_low": -15.0, "ci_high": -5.0},
            {"a": "adacad", "b": "fides", "metric": "cf", "diff": -5.0, "ci_low": -9.0, "ci_high": -1.0},
            {"a": "fides+agree", "b": "standard", "metric": "cf", "diff": 2.0, "ci_low": 0.5, "ci_high": 3.5},
        ],
    )
    original = _results(
        200,
        {"standard": {"em": 70.0}, "fides": {"em": 69.0}, "fides+agree": {"em": 70.0}},
        [
            {"a": "standard", "b": "fides", "metric": "em", "diff": 1.0, "ci_low": -0.5, "ci_high": 2.5},
            {"a": "standard", "b": "fides+agree", "metric": "em", "diff": 0.0, "ci_low": 0.0, "ci_high": 0.0},
        ],
    )
    _write(tmp_path, "qwen05-nqswap", conflict)
    _write(tmp_path, "qwen05-nqswap-original", original)
    lines = _run(tmp_path, "--gates").splitlines()
    at = next(i for i, line in enumerate(lines) if "(0.5B)" in line)
    assert (
        lines[at]
        == "| Qwen2.5-Coder-0.5B-Instruct (0.5B), n 40 (small n) / 200 | standard | 50.0 |  |  | 70.0 |  | – |"
    )
    assert (
        lines[at + 2]
        == "|  | fides | 60.0 | +10.0 [+5.0, +15.0] | +5.0 [+1.0, +9.0] | 69.0 | -1.0 [-2.5, +0.5] | 100.0 |"
    )
    assert lines[at + 3] == "|  | fides+agree | 52.0 | +2.0 [+0.5, +3.5] | – | 70.0 | +0.0 [+0.0, +0.0] | 7.5 |"
    assert "| SmolLM2-135M-Instruct (135M), n not run / not run | standard |" in _run(tmp_path, "--gates")
    headline = _run(tmp_path)
    assert (
        "| Qwen2.5-Coder-0.5B-Instruct (0.5B) | 40 (small n) / 200 | 50.0 | 55.0 | 60.0 | 52.0 | – | 70.0 | – | "
        "69.0 | 70.0 | – |" in headline
    )


def test_targets_say_whether_gated_fides_keeps_the_gain_and_does_no_harm(tmp_path):
    conflict = _results(
        200,
        {"standard": {"cf": 50.0}, "fides": {"cf": 60.0}, "fides+agree": {"cf": 59.0}, "fides+nwcad": {"cf": 51.0}},
        [
            {"a": "standard", "b": "fides", "metric": "cf", "diff": -10.0, "ci_low": -15.0, "ci_high": -5.0},
            {"a": "standard", "b": "fides+agree", "metric": "cf", "diff": -9.0, "ci_low": -14.0, "ci_high": -4.0},
            {"a": "standard", "b": "fides+nwcad", "metric": "cf", "diff": -1.0, "ci_low": -3.0, "ci_high": 1.0},
        ],
    )
    original = _results(
        100,
        {"standard": {"em": 70.0}, "fides+agree": {"em": 69.0}, "fides+nwcad": {"em": 70.0}},
        [
            {"a": "standard", "b": "fides+agree", "metric": "em", "diff": 1.0, "ci_low": -2.0, "ci_high": 4.0},
            {"a": "standard", "b": "fides+nwcad", "metric": "em", "diff": 0.0, "ci_low": 0.0, "ci_high": 0.0},
        ],
    )
    _write(tmp_path, "qwen15-nqswap", conflict)
    _write(tmp_path, "qwen15-nqswap-original", original)
    out = _run(tmp_path, "--targets")
    assert "| 1.5B | fides+agree | -1.0 [-4.0, +2.0] | 90% of +10.0 (+9.0) | yes |" in out
    assert "| 1.5B | fides+nwcad | +0.0 [+0.0, +0.0] | 10% of +10.0 (+1.0) | no |" in out
    assert "| 135M | fides+agree | not run | not run | – |" in out


def test_full_table_lists_every_method_and_the_no_conflict_differences(tmp_path):
    _write(
        tmp_path,
        "qwen15-nqswap-original",
        _results(
            8,
            {"standard": {"em": 80.0, "accuracy": 90.0}, "cad": {"em": 70.0, "accuracy": 85.0}},
            [
                {"a": "standard", "b": "cad", "metric": "em", "diff": 10.0, "ci_low": 0.0, "ci_high": 20.0},
            ],
        ),
    )
    out = _run(tmp_path, "--full")
    row = next(line for line in out.splitlines() if line.startswith("| 1.5B | 8 (small n) | 80.0 / 90.0"))
    assert "cad -10.0 [-20.0, +0.0]" in row
