"""Real backbones: the README quick start runs as written, the chat-template claims hold, leftovers are cleaned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_index.llms.fides import FidesLLM

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def test_readme_quick_start_runs_as_written():
    path = ROOT / "examples/quickstart_llamaindex.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and all(line.strip() for line in lines), lines
    assert lines[2].startswith("[") and "Document [" not in done.stdout


def test_readme_chat_template_claims(smollm_decoder):
    readme = (ROOT / "integrations/llama-index-llms-fides/README.md").read_text()
    assert "smollm2-135m-instruct has one; gemma3-270m, a base model, has none" in readme
    assert FidesLLM.from_decoder(smollm_decoder).metadata.is_chat_model is True
    gemma = FidesLLM.from_model_id("gemma3-270m", max_new_tokens=4)
    assert not getattr(gemma.decoder.tokenizer, "chat_template", None)
    assert gemma.metadata.is_chat_model is False


def test_template_leftovers_are_cleaned(smollm_decoder):
    # Measured before the fix: CAD answered 'Document [2]: The Colosseum is in Rome, Italy.\nDocument [3]: ...'
    llm = FidesLLM.from_decoder(smollm_decoder, method="cad", max_new_tokens=16)
    docs = ["The Eiffel Tower is in Rome, Italy.", "The Colosseum is an amphitheatre in Paris, France."]
    response = llm.complete("Where is the Eiffel Tower?", documents=docs)
    print(repr(response.text), response.additional_kwargs["notes"])
    assert response.text and "Document [" not in response.text and response.text == llm.last_result.text
    assert any(n.startswith("removed the template leftover 'Document [") for n in response.additional_kwargs["notes"])
    streamed = list(llm.stream_complete("Where is the Eiffel Tower?", documents=docs))
    assert "".join(r.delta for r in streamed) == response.text == streamed[-1].text
