"""The server on the bundled SmolLM2 as a real process: the three client quick starts (openai, LangChain's
ChatOpenAI in a RAG chain, LlamaIndex's OpenAILike in a query engine) run as written, and greedy answers through
the server equal the in-process ChatFides answers for the same messages and documents."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_server(request):
    start = request.getfixturevalue("start_server_module")
    return start(MODEL, "--max-new-tokens", "16")


def _run_example(name: str, url: str) -> list[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FIDES_RAG_URL": url, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


@pytest.mark.parametrize("name", ["serve_openai.py", "serve_langchain.py", "serve_llamaindex.py"])
def test_client_quick_starts_run_and_follow_the_document(smollm2_server, name):
    lines = _run_example(name, f"{smollm2_server.url}/v1")
    assert "rome" in lines[0].lower(), lines
    if name == "serve_openai.py":
        assert lines[1].startswith("fides [")


def test_greedy_answers_equal_in_process_chat_fides(smollm2_server):
    from langchain_fides import ChatFides

    chat = ChatFides.from_model_id(MODEL, method="fides", max_new_tokens=16)
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    documents = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Hamlet was written by Christopher Marlowe."]
    conversations = [
        [("user", "In which city is the Eiffel Tower located?")],
        [("system", "You answer in one short sentence."), ("user", "Who wrote Hamlet?")],
        [("user", "Hello!"), ("assistant", "Hi! Ask me anything."), ("user", "Who wrote Hamlet?")],
    ]
    for turns in conversations:
        for method in ("fides", "cad"):
            local = chat.invoke(turns, documents=documents, method=method)
            remote = client.chat.completions.create(
                model=MODEL, messages=[{"role": r, "content": c} for r, c in turns], max_tokens=16,
                extra_body={"documents": documents, "method": method})
            assert remote.choices[0].message.content == local.text, (turns, method)
            record = remote.model_extra["fides"]
            assert record["alphas"] == pytest.approx(local.response_metadata["alphas"], abs=1e-5)
            assert record["documents_source"] == local.response_metadata["documents_source"] == "documents"
