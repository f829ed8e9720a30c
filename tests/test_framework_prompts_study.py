"""benchmarks/framework_prompts_study.py runs end to end (tiny model, two NQ-Swap rows): every form and design is
captured from the real framework objects, FIDES through the objects equals the batched decode (the script checks
it and stops otherwise), and the tables and answers are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fides_rag.eval.datasets import data_dir
from fides_rag.testing import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (data_dir() / "nq_swap").is_dir(), reason="needs the NQ-Swap data of ../shared/data")
def test_the_study_runs_and_writes_its_tables(tmp_path):
    tokenizer = build_tokenizer(chat=True)
    build_tiny_model("llama", len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # one new token: the prompts are captured with a one-token budget, and a tiny model's window trims the passages
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/framework_prompts_study.py",
            "--model",
            str(tmp_path / "model"),
            "--limit",
            "2",
            "--max-new-tokens",
            "1",
            "--verify",
            "2",
            "--bootstrap",
            "50",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "model.json").read_text())
    labels = ["fides-rag template"] + [
        f"{f} / {d}"
        for f in ("llamaindex-text_qa", "langchain-stuff", "langchain-v1-chat")
        for d in ("emptied", "question")
    ]
    assert list(record["summaries"]) == labels and all(len(record["answers"][label]["fides"]) == 2 for label in labels)
    pairs = record["first_prompt_pairs"]
    assert "Answer the following question:" in pairs["langchain-stuff / question"][0][1]
    assert "Answer the following question:" not in pairs["langchain-stuff / emptied"][0][1]
    assert all(
        record["summaries"][label]["fides_mean_alpha"] >= 0.0 for label in labels
    )  # FIDES's α is recorded for every form
    assert all(len(record["fides_alphas"][label]) == 2 for label in labels)
    table = (tmp_path / "out" / "model.md").read_text()
    assert "| prompt / no-context path" in table and "FIDES α" in table


def test_check_against_stops_on_any_differing_answer(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import framework_prompts_study as study
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    longer = tmp_path / "longer.json"
    longer.write_text(json.dumps({"answers": {"form / emptied": {"fides": ["Rome", "Paris", "Oslo"]}}}))
    said = []
    study.check_against({"form / emptied": {"fides": ["Rome", "Paris"]}}, longer, said.append)
    assert said == [f"2 answers compared with {longer}: 0 differ"]
    with pytest.raises(SystemExit, match="1 of 2 answers differ"):
        study.check_against({"form / emptied": {"fides": ["Rome", "Lyon"]}}, longer, said.append)
