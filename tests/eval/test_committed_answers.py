"""The committed eval answers still come out of the decoder: a slice of a published run, decoded now with every
ungated method, gives the answers its predictions.jsonl holds (and gated methods leave them alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fides_rag import FidesDecoder, load_model
from fides_rag.eval.datasets import data_dir, load_examples
from fides_rag.eval.harness import build_methods, run_eval
from fides_rag.eval.records import read_predictions

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "eval" / "smollm2-nqswap-original"
ROWS = 12


def test_a_published_run_regenerates_with_the_same_answers(tmp_path):
    if not (data_dir() / "nq_swap").is_dir():
        pytest.skip("the NQ-Swap data (../shared/data) is not here")
    info = json.loads((RUN / "run.json").read_text())
    published = {r["id"]: r for r in read_predictions(RUN / "predictions.jsonl")}
    examples = load_examples(info["dataset"], limit=ROWS)
    model, tokenizer = load_model(info["model"])
    decoder = FidesDecoder(model, tokenizer)
    methods = build_methods(["standard", "cad", "adacad", "fides", "fides+agree"])
    run_eval(
        decoder,
        examples,
        methods,
        tmp_path,
        batch_size=info["batch_size"],
        max_new_tokens=info["max_new_tokens"],
        progress=False,
        bootstrap_samples=10,
    )
    now = {r["id"]: r for r in read_predictions(tmp_path / "predictions.jsonl")}
    assert len(now) == ROWS
    for example_id, record in now.items():
        for label in ("standard", "cad", "adacad", "fides"):
            assert record["outputs"][label]["text"] == published[example_id]["outputs"][label]["text"], (
                example_id,
                label,
            )
        if "fides+agree" in published[example_id]["outputs"]:
            assert record["outputs"]["fides+agree"]["text"] == published[example_id]["outputs"]["fides+agree"]["text"]
