"""benchmarks/padded_attention.py counts, per padding side and dtype, the cases where a padded attention call gives
the same bits as the unpadded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_padding_check_reports_every_case_per_side_and_dtype(tmp_path):
    out = tmp_path / "padded.json"
    printed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "padded_attention.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    report = json.loads(out.read_text())
    assert set(report["dtypes"]) == {"float32", "bfloat16"}
    for found in report["dtypes"].values():
        assert found["cases"] == len(report["lengths"]) * len(report["pads"]) == 20
        assert all(0 <= n <= found["cases"] for n in found["bitwise_equal"].values())
    assert "float32: right-padded equal in" in printed
