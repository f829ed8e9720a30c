"""benchmarks/kv_traffic.py --table prints its results files' tables; with --after, each cell reads 'before → after'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "kv_traffic.py"


def _run_entry(median: float, ops: int, ms: float | None) -> dict:
    return {
        "traffic_bytes_per_token": {"median": median, "max": 2 * median},
        "ops_per_token": ops,
        "decode_ms_per_token": ms,
    }


def _write(path: Path, runs: dict) -> str:
    path.write_text(json.dumps({"runs": runs}))
    return str(path)


def _table(*args: str) -> str:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--table", *args], check=True, capture_output=True, text=True
    ).stdout


def test_after_files_set_each_figure_beside_the_before_one_and_a_dash_where_one_is_missing(tmp_path):
    before = _write(
        tmp_path / "before.json",
        {"1025": {"cad": _run_entry(49.17e6, 3005, 2000.0)}, "16384": {"cad": _run_entry(756.93e6, 3005, None)}},
    )
    after = _write(tmp_path / "after.json", {"1025": {"cad": _run_entry(0.81e6, 2587, 1500.0)}})
    alone = _table(before)
    assert "| 1,025 | 49.17 [98.34] |" in alone and "→" not in alone
    both = _table(before, "--after", after)
    assert "| 1,025 | 49.17 [98.34] → 0.81 [1.62] |" in both
    assert "| 16,384 | 756.93 [1513.86] → - |" in both
    assert "| 1,025 | 2000.0 → 1500.0 |" in both and "| 16,384 | - → - |" in both
    assert "| 1,025 | 3,005 → 2,587 |" in both
