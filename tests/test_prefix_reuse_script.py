"""benchmarks/prefix_reuse.py --table prints a results file's table: both requests' time to first token, their
ratio, the tokens the second reused and whether its tokens equal the cache-off run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_reuse.py"


def _method(ratio: float, equal: bool) -> dict:
    return {
        "context_prompt_tokens": 1447,
        "no_context_prompt_tokens": 1330,
        "first_ttft_s": 10.0,
        "second_ttft_s": 10.0 * ratio,
        "ratio": ratio,
        "second_hit_tokens": 2048,
        "second_hits": 2,
        "tokens_equal_with_cache_off": equal,
        "checked_tokens": 16,
    }


def test_the_table_shows_each_methods_ratio_reuse_and_equality(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"methods": {"standard": _method(0.3, True), "fides": _method(0.25, False)}}))
    table = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", str(path)], check=True, capture_output=True, text=True
    ).stdout
    assert "| standard | 1,447 / 1,330 | 10,000 ms | 3,000 ms | 0.30 | 2,048 (2 paths) | yes (16) |" in table
    assert "| fides | 1,447 / 1,330 | 10,000 ms | 2,500 ms | 0.25 | 2,048 (2 paths) | NO (16) |" in table
