import json
import re
from pathlib import Path

import pytest

from fides_rag.cli.main import build_parser, main
from fides_rag.eval.datasets import data_dir
from fides_rag.eval.records import read_predictions


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
    argv = [
        "eval",
        "--model",
        "smollm2-135m-instruct",
        "--dataset",
        "nq-swap",
        "--data",
        str(data),
        "--methods",
        "standard,fides",
        "--limit",
        "4",
        "--batch-size",
        "4",
        "--max-new-tokens",
        "5",
        "--out",
        str(out),
        "--analyze",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 4
    record = json.loads(lines[0])
    assert set(record["outputs"]) == {"standard", "fides"}
    assert all(s.get("alpha") is not None for s in record["outputs"]["fides"]["steps"])
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["fides"]["n_cf"] == 4
    assert any(c["a"] == "standard" and c["b"] == "fides" and c["metric"] == "cf" for c in results["significance"])
    assert re.search(r"^\| fides +\|", (out / "results.md").read_text(), re.M) and re.search(
        r"^\| fides +\|", capsys.readouterr().out, re.M
    )
    for name in (
        "token_selectivity.png",
        "conflict_severity.png",
        "non_conflict_control.png",
        "trace.png",
        "trace.html",
    ):
        assert (out / "analysis" / name).is_file()
    # a rerun resumes with nothing left to do and keeps the file as it was
    assert main(argv) == 0
    assert (out / "predictions.jsonl").read_text().splitlines() == lines


def test_interrupted_eval_says_how_to_resume(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("fides_rag.cli.main._eval", interrupted)
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


# -- resuming a run folder only from the same data, settings and methods ---------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from fides_rag.testing import build_tiny_model, build_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_tiny_model("llama", len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _write_jsonl(path, answers=("Lyon", "Paris"), documents=("Lyon is the capital of France.", "Paris is big.")):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"q{i}",
            "question": f"Which city is number {i}?",
            "contexts": [d],
            "context_answers": [answers[0]],
            "memory_answers": [answers[1]],
        }
        for i, d in enumerate(documents)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval_args(model, out, *extra):
    return [
        "eval",
        "--model",
        str(model),
        "--methods",
        "standard,fides",
        "--max-new-tokens",
        "2",
        "--bootstrap",
        "5",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


def _predictions(out):
    return read_predictions(out / "predictions.jsonl")


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_resume_refuses_changed_data_content_at_the_same_path(tiny_folder, tmp_path, capsys):
    data, out = _write_jsonl(tmp_path / "qa.jsonl"), tmp_path / "run"
    argv = _eval_args(tiny_folder, out, "--dataset", "jsonl", "--data", str(data))
    assert main(argv) == 0
    kept = _predictions(out)
    assert main(argv) == 0 and _predictions(out) == kept  # the same data resumes with nothing to decode
    _write_jsonl(data, documents=("Rome is the capital of France.", "Paris is big."))
    capsys.readouterr()
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert (
        "different data_sha256" in err
        and "use a new --out folder, or delete" in err
        and "predictions.jsonl to start over" in err
    )
    assert _predictions(out) == kept
    fresh = tmp_path / "fresh"
    assert main(_eval_args(tiny_folder, fresh, "--dataset", "jsonl", "--data", str(data))) == 0
    (out / "predictions.jsonl").unlink()  # the named fix: start over, and get what a fresh run gets
    assert main(argv) == 0
    assert [r["outputs"]["fides"]["text"] for r in _predictions(out)] == [
        r["outputs"]["fides"]["text"] for r in _predictions(fresh)
    ]


def test_resume_refuses_other_data_under_fides_rag_data(tiny_folder, tmp_path, monkeypatch, capsys):
    def popqa(folder, passage):
        (folder / "popqa").mkdir(parents=True)
        (folder / "popqa" / "popqa_longtail.jsonl").write_text(
            json.dumps({"id": 1, "question": "Where?", "answers": ["Lyon"]}) + "\n"
        )
        (folder / "popqa" / "popqa_longtail_passages.txt").write_text(f"# {passage}\n")
        return folder

    out = tmp_path / "run"
    monkeypatch.setenv("FIDES_RAG_DATA", str(popqa(tmp_path / "a", "It is in Lyon.")))
    assert main(_eval_args(tiny_folder, out, "--dataset", "popqa")) == 0
    monkeypatch.setenv("FIDES_RAG_DATA", str(popqa(tmp_path / "b", "It is in Rome.")))  # only the passages differ
    capsys.readouterr()
    assert main(_eval_args(tiny_folder, out, "--dataset", "popqa")) == 2
    assert "different data_sha256" in _one_line_error(capsys)


def test_resume_refuses_a_changed_fides_config_under_the_same_label(tiny_folder, tmp_path, capsys):
    from fides_rag import FidesConfig

    data, out = _write_jsonl(tmp_path / "qa.jsonl"), tmp_path / "run"
    a0, a5 = (
        FidesConfig(fixed_alpha=0.0).to_file(tmp_path / "a0.json"),
        FidesConfig(fixed_alpha=5.0).to_file(tmp_path / "a5.json"),
    )
    base = ["--dataset", "jsonl", "--data", str(data)]
    assert main(_eval_args(tiny_folder, out, *base, "--fides-config", f"v={a0}")) == 0
    capsys.readouterr()
    assert main(_eval_args(tiny_folder, out, *base, "--fides-config", f"v={a5}")) == 2
    err = _one_line_error(capsys)
    assert "holds answers of fides-v decoded with other options (fides-v: fixed_alpha 0.0 -> 5.0)" in err
    assert "use a new --out folder or another method label" in err
    # another label decodes only that label; the base config is checked as before
    assert main(_eval_args(tiny_folder, out, *base, "--fides-config", f"v={a0}", "--fides-config", f"w={a5}")) == 0
    assert all(set(r["outputs"]) == {"standard", "fides", "fides-v", "fides-w"} for r in _predictions(out))
    capsys.readouterr()
    assert main(_eval_args(tiny_folder, out, *base, "--config", str(a5))) == 2
    assert "different config (config: fixed_alpha None -> 5.0)" in _one_line_error(capsys)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--limit", "0", "--limit: must be at least 1, got 0"),
        ("--limit", "-5", "--limit: must be at least 1, got -5"),
        ("--bootstrap", "0", "--bootstrap: must be at least 1, got 0"),
        ("--max-new-tokens", "0", "--max-new-tokens: must be at least 1, got 0"),
        ("--batch-size", "0", "--batch-size: must be at least 1, got 0"),
    ],
)
def test_bad_counts_are_refused_before_any_work(flag, value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--out", str(tmp_path / "run"), flag, value])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_bad_out_and_config_are_one_line_errors(tmp_path, capsys):
    data = _write_jsonl(tmp_path / "qa.jsonl")
    base = ["eval", "--dataset", "jsonl", "--data", str(data), "--model", str(tmp_path / "no-model-needed")]
    (tmp_path / "file").write_text("x")
    assert main([*base, "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder; pass a folder" in _one_line_error(capsys)
    assert main([*base, "--out", str(tmp_path / "file" / "run")]) == 2
    assert "cannot create the run folder" in _one_line_error(capsys)
    if Path("/sys").is_dir():  # a place nobody can write, root included
        assert main([*base, "--out", "/sys/fides-rag-run"]) == 2
        assert "in a place you can write" in _one_line_error(capsys)
    assert main([*base, "--out", str(tmp_path / "run"), "--config", str(tmp_path)]) == 2
    assert f"FidesConfig file {tmp_path} is a directory" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()
