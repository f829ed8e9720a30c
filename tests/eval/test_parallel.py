"""Data-parallel eval: 2 processes under torchrun (gloo, CPU, one thread each) give the results of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fides_rag.eval.parallel import shard
from fides_rag.testing import build_tiny_model, build_tokenizer

N = 24


def test_shards_are_disjoint_and_cover_every_item():
    items = list(range(11))
    parts = [shard(items, r, 3) for r in range(3)]
    assert sorted(sum(parts, [])) == items and all(set(a).isdisjoint(b) for a in parts for b in parts if a is not b)


@pytest.fixture(scope="module")
def tiny_run_inputs(tmp_path_factory):
    """A tiny random-weight llama saved as a folder, and an N-example conflict jsonl."""
    root = tmp_path_factory.mktemp("parallel")
    tokenizer = build_tokenizer()
    build_tiny_model("llama", len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = [{"id": f"ex{i}", "question": f"What is the capital of country {i}?", "contexts": [f"City {i} is the capital of country {i}."],
             "context_answers": [f"City {i}"], "memory_answers": ["Paris"]} for i in range(N)]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def _eval_args(root: Path, out: Path, batch_size: int = 4, new_tokens: int = 4) -> list[str]:
    return ["-m", "fides_rag.cli", "eval", "--model", str(root / "model"), "--dataset", "jsonl", "--data", str(root / "data.jsonl"),
            "--methods", "standard,fides", "--batch-size", str(batch_size), "--max-new-tokens", str(new_tokens), "--device", "cpu", "--no-progress",
            "--bootstrap", "200", "--out", str(out)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _torchrun(root: Path, out: Path, batch_size: int = 4, new_tokens: int = 4) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             *_eval_args(root, out, batch_size, new_tokens)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _comparable(results: dict) -> dict:
    return {"metrics": results["metrics"], "significance": results["significance"], "examples": results["run"]["examples"]}


def _records(out: Path) -> dict[str, dict]:
    rows = [json.loads(line) for p in sorted(out.glob("shard-*/predictions.jsonl")) for line in p.read_text().splitlines() if line]
    return {r["id"]: r for r in rows}


@pytest.mark.slow
def test_two_processes_equal_one(tiny_run_inputs, tmp_path):
    one = subprocess.run([sys.executable, *_eval_args(tiny_run_inputs, tmp_path / "one")], env=_env(), capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(tiny_run_inputs, tmp_path / "two")
    _, err = two.communicate(timeout=900)
    assert two.returncode == 0, err[-3000:]
    shards = sorted(p.parent.name for p in (tmp_path / "two").glob("shard-*/predictions.jsonl"))
    assert shards == ["shard-0-of-2", "shard-1-of-2"]
    first = json.loads((tmp_path / "one" / "results.json").read_text())
    second = json.loads((tmp_path / "two" / "results.json").read_text())
    assert _comparable(second) == _comparable(first) and second["run"]["processes"] == 2
    single = {json.loads(l)["id"]: json.loads(l)["outputs"] for l in (tmp_path / "one" / "predictions.jsonl").read_text().splitlines()}
    assert {i: r["outputs"] for i, r in _records(tmp_path / "two").items()} == single
