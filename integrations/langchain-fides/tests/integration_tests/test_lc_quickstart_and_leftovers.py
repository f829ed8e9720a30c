"""Real smollm2-135m-instruct: the README quick start runs as written; template leftovers are cut and cleaned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_fides import FidesLLM

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[4]


def test_readme_quick_start_runs_as_written():
    path = ROOT / "examples/quickstart_langchain.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and all(line.strip() for line in lines), lines
    assert lines[1].startswith("[") and "Document [" not in done.stdout


def test_template_leftovers_are_cleaned_in_invoke_and_stream():
    # Measured before the fix: CAD answered 'Document [2]: The Colosseum is in Rome, Italy.\nDocument [3]: ...'
    llm = FidesLLM.from_model_id("smollm2-135m-instruct", method="cad", max_new_tokens=16)
    docs = ["The Eiffel Tower is in Rome, Italy.", "The Colosseum is an amphitheatre in Paris, France."]
    answer = llm.invoke("Where is the Eiffel Tower?", documents=docs)
    print(repr(answer), llm.last_result.notes)
    assert answer and "Document [" not in answer and "Using only" not in answer
    assert any(n.startswith("removed the template leftover 'Document [") for n in llm.last_result.notes)
    assert llm.last_result.text == answer
    assert "".join(llm.stream("Where is the Eiffel Tower?", documents=docs)) == answer
