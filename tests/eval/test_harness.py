import json
import re

import pytest

from fides_rag.decoder import FidesDecoder
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.harness import (
    RESULTS_JSON,
    RESULTS_MD,
    ablation_methods,
    build_methods,
    results_markdown,
    run_eval,
    runnable_methods,
    summarize,
)
from fides_rag.eval.records import read_predictions
from fides_rag.eval.store import PREDICTIONS
from fides_rag.method.config import FidesConfig

EXAMPLES = [
    QAExample(
        f"What is the capital number {i}?",
        (("Lyon is the capital of France. " * (1 + i % 3)).strip(),),
        ("Lyon",),
        ("Paris",),
        f"ex-{i}",
    )
    for i in range(7)
]


@pytest.fixture
def decoder(tokenizer, tiny_llama):
    return FidesDecoder(tiny_llama, tokenizer)


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def test_ablation_labels():
    labels = list(ablation_methods(FidesConfig()))
    assert labels == [
        "fides-no-opposition",
        "fides-no-shift",
        "fides-no-noise",
        "fides-opposition-only",
        "fides-fixed-alpha-1.0",
    ]
    methods = build_methods(["standard", "fides"], FidesConfig(), ablations=True)
    assert list(methods)[:2] == ["standard", "fides"] and len(methods) == 7
    assert methods["fides-fixed-alpha-1.0"].config.fixed_alpha == 1.0
    assert methods["fides-no-shift"].config.weights[1] == 0.0


def test_run_eval_writes_everything(decoder, tmp_path):
    methods = build_methods(["standard", "cad", "fides"])
    results = run_eval(
        decoder, EXAMPLES[:3], methods, tmp_path, batch_size=2, max_new_tokens=4, progress=False, bootstrap_samples=50
    )
    assert sorted(_ids(tmp_path / PREDICTIONS)) == ["ex-0", "ex-1", "ex-2"]
    record = read_predictions(tmp_path / PREDICTIONS)[0]
    fides = record["outputs"]["fides"]
    assert {"text", "steps", "scores", "mean_alpha"} <= set(fides)
    assert "context_prompt" not in fides
    assert all({"alpha", "opposition", "shift", "noise"} <= set(s) for s in fides["steps"])
    assert "alpha" not in record["outputs"]["standard"]["steps"][0]
    saved = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert saved["metrics"]["fides"]["n"] == 3 and saved["metrics"]["fides"]["n_cf"] == 3
    pairs = {(c["a"], c["b"], c["metric"]) for c in saved["significance"]}
    assert ("cad", "fides", "cf") in pairs and ("standard", "fides", "em") in pairs
    assert results["run"]["examples"] == 3
    table = (tmp_path / RESULTS_MD).read_text()
    assert re.search(r"^\| fides +\|", table, re.M) and "fides vs standard" in table


def test_results_match_single_method_decoding(decoder, tmp_path):
    run_eval(
        decoder,
        EXAMPLES[:2],
        build_methods(["cad", "fides"]),
        tmp_path,
        batch_size=2,
        max_new_tokens=4,
        progress=False,
        bootstrap_samples=10,
    )
    by_id = {r["id"]: r for r in read_predictions(tmp_path / PREDICTIONS)}
    alone = decoder.generate(EXAMPLES[1].question, list(EXAMPLES[1].contexts), method="fides", max_new_tokens=4)
    assert by_id["ex-1"]["outputs"]["fides"]["text"] == alone.text


def test_resume_after_interrupt(decoder, tmp_path, monkeypatch):
    methods = build_methods(["standard", "fides"])
    real = decoder.generate_batch
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(decoder, "generate_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_eval(decoder, EXAMPLES, methods, tmp_path, batch_size=2, max_new_tokens=3, progress=False)
    first = _ids(tmp_path / PREDICTIONS)
    assert len(first) == 4  # two batches of two were flushed

    # a half-written last line (killed mid-write) is dropped and its example redone
    with (tmp_path / PREDICTIONS).open("a") as handle:
        handle.write('{"id": "ex-9", "outputs": {"stan')

    seen = []

    def counting(questions, *args, **kwargs):
        seen.extend(questions)
        return real(questions, *args, **kwargs)

    monkeypatch.setattr(decoder, "generate_batch", counting)
    results = run_eval(
        decoder, EXAMPLES, methods, tmp_path, batch_size=2, max_new_tokens=3, progress=False, bootstrap_samples=20
    )
    ids = _ids(tmp_path / PREDICTIONS)
    assert len(ids) == len(set(ids)) == len(EXAMPLES)  # nothing lost, no duplicates
    assert set(ids) == {e.id for e in EXAMPLES}
    assert ids[:4] == first  # earlier lines kept as they were
    assert len(seen) == len(EXAMPLES) - 4  # only the missing examples were decoded
    assert results["metrics"]["fides"]["n"] == len(EXAMPLES)

    # a third run has nothing left to decode
    seen.clear()
    run_eval(decoder, EXAMPLES, methods, tmp_path, batch_size=2, max_new_tokens=3, progress=False, bootstrap_samples=20)
    assert seen == []


def test_resume_refuses_a_different_run(decoder, tmp_path):
    run_eval(
        decoder,
        EXAMPLES[:1],
        build_methods(["standard"]),
        tmp_path,
        max_new_tokens=2,
        progress=False,
        run_info={"model": "a"},
    )
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_eval(
            decoder,
            EXAMPLES[:1],
            build_methods(["standard"]),
            tmp_path,
            max_new_tokens=3,
            progress=False,
            run_info={"model": "a"},
        )


def test_new_method_on_resume_decodes_only_that_method(decoder, tmp_path, monkeypatch):
    run_eval(
        decoder,
        EXAMPLES[:2],
        build_methods(["standard"]),
        tmp_path,
        max_new_tokens=2,
        progress=False,
        bootstrap_samples=10,
    )
    first = {r["id"]: r["outputs"]["standard"] for r in read_predictions(tmp_path / PREDICTIONS)}
    decoded: list[list[str]] = []
    real = decoder.generate_batch

    def spy(questions, documents, *, methods, **kwargs):
        decoded.append(list(methods))
        return real(questions, documents, methods=methods, **kwargs)

    monkeypatch.setattr(decoder, "generate_batch", spy)
    run_eval(
        decoder,
        EXAMPLES[:2],
        build_methods(["standard", "cad"]),
        tmp_path,
        max_new_tokens=2,
        progress=False,
        bootstrap_samples=10,
    )
    assert decoded == [["cad"]]
    records = read_predictions(tmp_path / PREDICTIONS)
    assert len(records) == 2 and all(list(r["outputs"]) == ["standard", "cad"] for r in records)
    assert all(r["outputs"]["standard"] == first[r["id"]] for r in records)
    alone = run_eval(
        decoder,
        EXAMPLES[:2],
        build_methods(["cad"]),
        tmp_path / "cad-alone",
        max_new_tokens=2,
        progress=False,
        bootstrap_samples=10,
    )
    merged = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert merged["metrics"]["cad"] == alone["metrics"]["cad"]


def test_bad_middle_line_is_an_error(tmp_path):
    (tmp_path / PREDICTIONS).write_text('{"id": "a", "outputs": {}}\nnot json\n{"id": "b", "outputs": {}}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_predictions(tmp_path / PREDICTIONS)


def test_methods_needing_several_documents_are_skipped_or_refused():
    two_docs = QAExample("Q?", ("a", "b"), ("a",), (), "two")
    assert runnable_methods(["standard", "dvd"], [two_docs]) == (["standard", "dvd"], {})
    names, skipped = runnable_methods(["standard", "dvd"], [two_docs, EXAMPLES[0]], skip=True)
    assert names == ["standard"] and "1 of the 2 examples" in skipped["dvd"]
    with pytest.raises(ValueError, match="method 'dvd' cannot run on this dataset: it needs at least 2 documents"):
        runnable_methods(["standard", "dvd"], [two_docs, EXAMPLES[0]])


def test_bootstrap_is_checked_before_decoding(decoder, tmp_path, monkeypatch):
    monkeypatch.setattr(
        decoder, "generate_batch", lambda *a, **k: pytest.fail("decoded before checking bootstrap_samples")
    )
    with pytest.raises(ValueError, match="bootstrap_samples must be >= 1, got 0"):
        run_eval(
            decoder,
            EXAMPLES[:1],
            build_methods(["standard"]),
            tmp_path,
            max_new_tokens=2,
            progress=False,
            bootstrap_samples=0,
        )


def test_run_json_records_each_labels_rule_and_a_changed_one_is_refused(decoder, tmp_path):
    from fides_rag.eval.harness import check_resumable
    from fides_rag.eval.store import METHOD_OPTIONS, RUN_INFO
    from fides_rag.rules import get_method

    methods = {"cad": get_method("cad", alpha=0.5), "fides": "fides"}
    run_eval(decoder, EXAMPLES[:1], methods, tmp_path, max_new_tokens=2, progress=False, bootstrap_samples=5)
    recorded = json.loads((tmp_path / RUN_INFO).read_text())[METHOD_OPTIONS]
    assert recorded["cad"] == {"method": "cad", "options": {"alpha": 0.5}}
    assert recorded["fides"]["method"] == "fides" and recorded["fides"]["options"]["weights"] == [0.5, 0.3, 0.2]
    check_resumable(tmp_path, methods, max_new_tokens=2)  # the same run: nothing to refuse
    with pytest.raises(
        ValueError, match=r"holds answers of cad decoded with other options \(cad: alpha 0\.5 -> 2\.0\)"
    ):
        check_resumable(tmp_path, {"cad": get_method("cad", alpha=2.0)}, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"fides: lambda_ 1\.5 -> 3\.0"):
        run_eval(
            decoder,
            EXAMPLES[:1],
            {"fides": get_method("fides", lambda_=3.0)},
            tmp_path,
            max_new_tokens=2,
            progress=False,
        )


def _scored(question, fides, standard):
    return {
        "id": f"{question}-{fides}{standard}",
        "question": question,
        "outputs": {
            m: {"scores": {"cf": v, "em": v, "f1": v}, "steps": [], "new_tokens": 1, "text": "x", "method": m}
            for m, v in (("fides", fides), ("standard", standard))
        },
    }


def test_bootstrap_by_question_resamples_questions_and_says_so():
    records = [
        _scored(q, f, s)
        for q, f, s in [("q1", 1, 0), ("q1", 1, 0), ("q1", 1, 0), ("q2", 0, 0), ("q3", 1, 1), ("q3", 0, 1)]
    ]
    by_row = summarize(records, ["standard", "fides"], bootstrap_samples=200, bootstrap_by="row")
    by_question = summarize(records, ["standard", "fides"], bootstrap_samples=200)  # questions: the default
    assert by_row["bootstrap_by"] == "row" and all(c["clusters"] is None for c in by_row["significance"])
    assert by_question["bootstrap_by"] == "question" and all(c["clusters"] == 3 for c in by_question["significance"])
    assert [c["diff"] for c in by_question["significance"]] == [c["diff"] for c in by_row["significance"]]
    assert "of the 3 questions" in results_markdown(by_question) and "of the rows" in results_markdown(by_row)


def test_an_unknown_bootstrap_unit_is_refused_before_decoding(decoder, tmp_path):
    with pytest.raises(ValueError, match="bootstrap_by must be one of question, row"):
        run_eval(decoder, EXAMPLES[:2], build_methods(["standard"]), tmp_path, progress=False, bootstrap_by="example")
    assert not (tmp_path / PREDICTIONS).exists()


def test_each_method_reports_the_share_of_tokens_contrasted_and_the_answer_length(decoder, tmp_path):
    methods = build_methods(["standard", "fides", "fides+agree", "cad+nwcad"])
    results = run_eval(
        decoder, EXAMPLES[:3], methods, tmp_path, batch_size=3, max_new_tokens=5, progress=False, bootstrap_samples=20
    )
    metrics = results["metrics"]
    assert metrics["standard"]["share_contrasted"] == 0.0 and metrics["fides"]["share_contrasted"] == 100.0
    records = read_predictions(tmp_path / PREDICTIONS)
    for label in ("fides+agree", "cad+nwcad"):
        steps = [s for r in records for s in r["outputs"][label]["steps"]]
        assert all("gate" in s for s in steps)
        assert metrics[label]["share_contrasted"] == pytest.approx(
            100 * sum(s["gate"] == 0 for s in steps) / len(steps)
        )
        words = [len(r["outputs"][label]["text"].split()) for r in records]
        assert metrics[label]["mean_answer_words"] == pytest.approx(sum(words) / len(words))
    assert results["bootstrap_by"] == "question"
    assert "contrasted %" in (tmp_path / RESULTS_MD).read_text()
