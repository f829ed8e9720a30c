"""benchmarks/pool_sharing.py runs end to end on a tiny model and reports what sharing prompt blocks saves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_script_reports_peaks_shared_positions_and_equal_tokens(tmp_path):
    out = tmp_path / "sharing.json"
    args = ["--tiny", "--requests", "3", "--new-tokens", "24", "--repeats", "2", "--kv-pool-tokens", "8192"]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pool_sharing.py"), *args, "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.read_text())
    shared, copied = report["decoders"]["shared"], report["decoders"]["copied"]
    assert shared["shared_tokens"] > 0 and copied["shared_tokens"] == 0
    assert shared["failed"] == copied["failed"] == 0
    assert 0 < shared["peak_used_tokens_second_wave"] < copied["peak_used_tokens_second_wave"]
    assert report["requests_with_equal_tokens"].endswith("/ 6")
    table = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pool_sharing.py"), "--table", str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert table.startswith("| decoder | most requests decoding together |") and "| shared |" in table
    assert shared["most_requests_decoding_together"] == 3
