import json
import re

import pytest

from fides_rag.cli import build_parser, main
from fides_rag.eval.datasets import data_dir


def test_eval_parser_defaults_and_validation():
    args = build_parser().parse_args(["eval", "--out", "runs/x"])
    assert args.methods == ["standard", "cad", "adacad", "fides"] and args.batch_size == 8 and args.max_new_tokens == 32
    assert args.bootstrap == 1000 and not args.ablations
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--out", "x", "--methods", "standard,nope"])


@pytest.mark.slow
def test_eval_end_to_end_smollm2(tmp_path, capsys):
    data = data_dir() / "nq_swap" / "nq_swap_dev_public.parquet"
    if not data.is_file():
        pytest.skip("NQ-Swap data not available")
    out = tmp_path / "run"
    argv = ["eval", "--model", "smollm2-135m-instruct", "--dataset", "nq-swap", "--data", str(data), "--methods", "standard,fides",
            "--limit", "4", "--batch-size", "4", "--max-new-tokens", "5", "--out", str(out), "--analyze", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 4
    record = json.loads(lines[0])
    assert set(record["outputs"]) == {"standard", "fides"}
    assert all(s.get("alpha") is not None for s in record["outputs"]["fides"]["steps"])
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["fides"]["n_cf"] == 4
    assert any(c["a"] == "standard" and c["b"] == "fides" and c["metric"] == "cf" for c in results["significance"])
    assert re.search(r"^\| fides +\|", (out / "results.md").read_text(), re.M) and re.search(r"^\| fides +\|", capsys.readouterr().out, re.M)
    for name in ("token_selectivity.png", "conflict_severity.png", "non_conflict_control.png", "trace.png", "trace.html"):
        assert (out / "analysis" / name).is_file()
    # a rerun resumes with nothing left to do and keeps the file as it was
    assert main(argv) == 0
    assert (out / "predictions.jsonl").read_text().splitlines() == lines


def test_interrupted_eval_says_how_to_resume(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("fides_rag.cli._eval", interrupted)
    assert main(["eval", "--out", "runs/somewhere"]) == 130
    assert "answers so far are in runs/somewhere; rerun the same command to resume" in capsys.readouterr().err


def test_eval_with_a_missing_or_corrupt_data_file_is_a_one_line_error_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--dataset", "nq-swap", "--data", "data/nope", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fides-rag eval: error: no file at data/nope") and len(err.strip().splitlines()) == 1
    corrupt = tmp_path / "nq.parquet"
    corrupt.write_bytes(b"PAR1" + b"\x00garbage" * 40 + b"PAR1")
    assert main(["eval", "--dataset", "nq-swap", "--data", str(corrupt), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "nq.parquet" in err and "cannot be read as parquet" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
