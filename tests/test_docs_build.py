"""The docs site builds with `mkdocs build --strict`: a broken link or anchor, a page missing from the nav, or an API
reference to an object that does not exist fails the suite (and CI, which runs `make test`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "No module named mkdocs" not in done.stderr, (
        'the docs build needs the docs extra: pip install -e ".[docs]" (make setup installs it)'
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count(
        'class="doc doc-heading"'
    ) >= 10  # the API reference rendered
