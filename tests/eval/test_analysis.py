import json

import pytest

from fides_rag.eval.analysis import (
    auroc,
    conflict_severity,
    example_trace,
    non_conflict_control,
    run_analyses,
    token_category,
    token_selectivity,
)
from fides_rag.eval.metrics import score_prediction
from fides_rag.eval.store import PREDICTIONS


def _step(token, alpha=None, opposition=None):
    step = {"token": token, "token_id": 0}
    if alpha is not None:
        step.update(
            alpha=alpha,
            opposition=opposition if opposition is not None else alpha / 2,
            shift=0.01,
            noise=0.3,
            score=alpha / 1.5,
        )
    return step


def _record(i, conflict, jsd, fides_right):
    answer, memory = f"Lyon{i}", "Paris"
    fides_text = answer if fides_right else memory
    fides_steps = [
        _step(" the", 0.2, jsd),
        _step(f" {answer}", 0.9),
        _step(" in", 0.25),
        _step(" 1900", 0.5),
        _step(" city", 0.4),
    ]
    std_steps = [_step(" the"), _step(" Paris")]
    outputs = {
        "standard": {
            "text": memory,
            "steps": std_steps,
            "scores": score_prediction(memory, [answer], [memory] if conflict else []),
            "new_tokens": 2,
        },
        "fides": {
            "text": fides_text,
            "steps": fides_steps,
            "scores": score_prediction(fides_text, [answer], [memory] if conflict else []),
            "new_tokens": 5,
        },
    }
    return {
        "id": f"ex-{i:02d}",
        "question": f"q{i}",
        "context_answers": [answer],
        "memory_answers": [memory] if conflict else [],
        "conflict": conflict,
        "outputs": outputs,
    }


@pytest.fixture
def records():
    # severity grows with i; fides follows the context only in the top half
    return [_record(i, conflict=i < 8, jsd=0.05 * (i + 1), fides_right=i >= 4) for i in range(10)]


def test_token_category():
    answers = ["Yuliya Snigir"]
    assert token_category(" Yul", answers) == "answer"  # sub-word piece of an answer word
    assert token_category(" Snigir", answers) == "answer"
    assert token_category(" the", answers) == "function"
    assert token_category(" 1994", answers) == "numeric/entity"
    assert token_category(" Paris", answers) == "numeric/entity"
    assert token_category(" song", answers) == "other"
    assert token_category(".", answers) == "other"
    assert token_category(" of", ["Bank of England"]) == "answer"  # a whole word of the answer


def test_auroc_rank_formula():
    assert auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.5], [True]) is None
    from sklearn.metrics import roc_auc_score

    scores, labels = [0.3, 0.7, 0.7, 0.1, 0.9, 0.4], [False, True, False, False, True, True]
    assert auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))


def test_token_selectivity(records, tmp_path):
    result = token_selectivity(records, tmp_path)
    fides = result["methods"]["fides"]
    assert list(result["methods"]) == ["fides"]  # standard has no alpha
    assert fides["mean_alpha"]["function"] == pytest.approx(0.225)
    assert fides["count"] == {"answer": 10, "function": 20, "numeric/entity": 10, "other": 10}
    assert fides["auroc_answer_vs_rest"] == 1.0  # answer tokens carry the highest alpha
    assert (tmp_path / "token_selectivity.png").stat().st_size > 0


def test_conflict_severity(records, tmp_path):
    result = conflict_severity(records, tmp_path)
    assert result["metric"] == "cf" and result["examples_with_jsd"] == 8
    buckets = result["buckets"]
    assert [b["n"] for b in buckets] == [2, 2, 2, 2]
    assert [b["score"]["fides"] for b in buckets] == [0.0, 0.0, 100.0, 100.0]
    assert all(b["score"]["standard"] == 0.0 for b in buckets)
    assert buckets[0]["jsd_max"] < buckets[-1]["jsd_min"]
    assert (tmp_path / "conflict_severity.png").is_file()


def test_non_conflict_control(records, tmp_path):
    result = non_conflict_control(records, tmp_path)
    assert result["examples"] == 2
    assert result["methods"]["fides"]["em"] == 100.0 and result["methods"]["standard"]["em"] == 0.0
    assert result["methods"]["fides"]["mean_alpha"] == pytest.approx(0.45)
    assert result["methods"]["standard"]["mean_alpha"] is None
    assert (tmp_path / "non_conflict_control.png").is_file()
    assert "note" in non_conflict_control([r for r in records if r["conflict"]])


def test_trace(records, tmp_path):
    result = example_trace(records, tmp_path)
    assert result["id"] == "ex-00" and result["method"] == "fides" and len(result["tokens"]) == 5
    page = (tmp_path / "trace.html").read_text()
    assert "Lyon0" in page and "background:" in page
    assert (tmp_path / "trace.png").stat().st_size > 0
    assert example_trace(records, None, example_id="ex-05")["id"] == "ex-05"
    with pytest.raises(ValueError):
        example_trace(records, None, example_id="missing")


def test_run_analyses_and_cli(records, tmp_path):
    (tmp_path / PREDICTIONS).write_text("".join(json.dumps(r) + "\n" for r in records))
    from fides_rag.cli.main import main

    assert main(["analyze", str(tmp_path)]) == 0
    names = {p.name for p in (tmp_path / "analysis").iterdir()}
    for stem in ("token_selectivity", "conflict_severity", "non_conflict_control", "trace"):
        assert f"{stem}.json" in names and f"{stem}.png" in names
    assert "trace.html" in names
    report = run_analyses(tmp_path, method="fides", example_id="ex-03")
    assert report["trace"]["id"] == "ex-03"
