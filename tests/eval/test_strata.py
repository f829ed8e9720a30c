"""Strata: rows split by passage and closed-book knowledge, seeded row selection, scores against standard."""

import json
import re

import pytest

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.metrics import score_prediction
from fides_rag.eval.strata import (
    STRATA,
    assign_strata,
    check_original_answers,
    check_strata_folder,
    check_strata_results,
    count_strata,
    count_strata_questions,
    describe_per_stratum,
    missing_answers,
    parse_per_stratum,
    score_metric,
    select_rows,
    strata_counts,
    strata_markdown,
    summarize_strata,
)


def _example(i, swapped, question=None):
    question = question or f"question {i}?"
    if swapped:
        return QAExample(question, ("swapped",), ("Lyon",), ("Paris",), f"r{i}", {}, ("Paris",))
    return QAExample(question, ("original",), ("Paris",), (), f"r{i}", {}, ("Paris",))


def test_each_row_falls_in_its_stratum_by_passage_and_closed_book_answer():
    examples = [
        _example(0, True, "known?"),
        _example(1, True, "unknown?"),
        _example(2, False, "known?"),
        _example(3, False, "unknown?"),
    ]
    strata = assign_strata(examples, {"known?": "It is Paris", "unknown?": "Marseille"})
    assert strata == {"r0": "true_conflict", "r1": "supplied", "r2": "known_agreeing", "r3": "unknown_agreeing"}
    assert count_strata(strata) == dict.fromkeys(STRATA, 1)


def test_a_closed_book_answer_that_only_mentions_the_answer_in_a_sentence_is_not_known():
    examples = [_example(0, True, "q?")]
    assert assign_strata(examples, {"q?": "I think that it might be in Paris or somewhere"}) == {"r0": "supplied"}


def test_rows_without_an_original_answer_are_refused_naming_the_fields():
    rows = [QAExample("q?", ("p",), ("a",), (), "x1")]
    with pytest.raises(ValueError, match="memory_answers.*original_answers"):
        check_original_answers(rows)


def test_a_missing_closed_book_answer_is_an_error():
    with pytest.raises(ValueError, match="no closed-book answer"):
        assign_strata([_example(0, True)], {})


def _forty_rows_in_four_strata():
    """40 rows, alternately swapped and original, 10 in each stratum."""
    examples = [_example(i, i % 2 == 0) for i in range(40)]
    strata = {
        e.id: ("true_conflict" if e.is_conflict else "known_agreeing")
        if int(e.id[1:]) % 4 < 2
        else ("supplied" if e.is_conflict else "unknown_agreeing")
        for e in examples
    }
    return examples, strata


def test_selection_takes_the_first_n_of_each_stratum_of_a_seeded_shuffle():
    examples, strata = _forty_rows_in_four_strata()
    chosen = select_rows(examples, strata, 3, seed=7)
    assert count_strata({e.id: strata[e.id] for e in chosen}) == dict.fromkeys(STRATA, 3)
    assert [e.id for e in chosen] == [e.id for e in select_rows(examples, strata, 3, seed=7)]
    assert [e.id for e in chosen] != [e.id for e in select_rows(examples, strata, 3, seed=8)]
    assert [e.id for e in chosen] != [
        e.id for e in examples if e.id in {c.id for c in chosen}
    ]  # shuffled, not file order
    assert select_rows(examples, strata, None, seed=7) == examples
    with pytest.raises(ValueError, match="per_stratum"):
        select_rows(examples, strata, 0, seed=7)


def test_a_count_per_stratum_takes_every_row_of_small_strata_and_samples_the_rest():
    examples, strata = _forty_rows_in_four_strata()
    spec = parse_per_stratum("2,true_conflict=300,known_agreeing=4")
    chosen = select_rows(examples, strata, spec, seed=7)
    assert count_strata({e.id: strata[e.id] for e in chosen}) == {
        "true_conflict": 10,
        "supplied": 2,
        "known_agreeing": 4,
        "unknown_agreeing": 2,
    }
    uniform = {e.id for e in select_rows(examples, strata, 2, seed=7)}
    assert uniform <= {e.id for e in chosen}  # the same shuffle: a larger count only adds rows
    every_conflict = select_rows(examples, strata, {"true_conflict": 1}, seed=7)  # strata not named keep every row
    assert count_strata({e.id: strata[e.id] for e in every_conflict})["supplied"] == 10
    assert describe_per_stratum(spec) == (
        "the first 300 of true_conflict, 2 of supplied, 4 of known_agreeing, 2 of unknown_agreeing"
    )
    assert describe_per_stratum(300) == "the first 300 of each"


def test_per_stratum_spec_parses_a_count_or_counts_by_stratum():
    assert parse_per_stratum("300") == 300
    assert parse_per_stratum("true_conflict=300") == {
        "true_conflict": 300,
        "supplied": None,
        "known_agreeing": None,
        "unknown_agreeing": None,
    }
    assert parse_per_stratum(" 50, supplied=10 ")["unknown_agreeing"] == 50


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("conflict=3", "unknown stratum 'conflict'"),
        ("supplied=3,supplied=4", "sets supplied twice"),
        ("3,4", "sets the default count twice"),
        ("supplied=many", "expected N or STRATUM=N"),
        ("supplied=0", ">= 1"),
    ],
)
def test_a_bad_per_stratum_spec_names_what_to_fix(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_per_stratum(spec)


def _record(i, question, swapped, answers):
    context, memory = ("Lyon", "Paris") if swapped else ("Paris", None)
    outputs = {
        label: {
            "text": text,
            "method": label.split("+")[0],
            "steps": [{"token": "x"}] * 2,
            "scores": score_prediction(text, [context], [memory] if memory else []),
        }
        for label, text in answers.items()
    }
    return {"id": f"r{i}", "question": question, "outputs": outputs}


def test_summary_counts_regressions_and_fixes_against_standard_per_stratum():
    records = [
        _record(0, "q0", True, {"standard": "Lyon", "fides": "Lyon"}),
        _record(1, "q1", True, {"standard": "Paris", "fides": "Lyon"}),
        _record(2, "q2", True, {"standard": "Lyon", "fides": "Paris"}),
        _record(3, "q3", True, {"standard": "Paris", "fides": "Lyon"}),
        _record(4, "q4", False, {"standard": "Paris", "fides": "Lyon"}),
        _record(5, "q5", False, {"standard": "Paris", "fides": "Paris, France"}),
    ]
    strata = {
        "r0": "true_conflict",
        "r1": "true_conflict",
        "r2": "true_conflict",
        "r3": "true_conflict",
        "r4": "known_agreeing",
        "r5": "known_agreeing",
    }
    summary = summarize_strata(records, strata, ["standard", "fides"], samples=200)
    tc = summary["true_conflict"]["fides"]
    assert (tc["n"], tc["metric"], tc["score"], tc["regressions"], tc["fixes"]) == (4, "cf", 75.0, 1, 2)
    assert tc["regressions_pct"] == 25.0 and tc["fixes_pct"] == 50.0 and tc["standard_right"] == 2
    assert tc["diff_vs_standard"] == pytest.approx(25.0) and tc["ci_vs_standard"][0] <= 25.0 <= tc["ci_vs_standard"][1]
    assert tc["share_contrasted"] == 100.0 and summary["true_conflict"]["standard"]["share_contrasted"] == 0.0
    agreeing = summary["known_agreeing"]["fides"]
    assert (agreeing["metric"], agreeing["score"], agreeing["regressions"], agreeing["containment"]) == (
        "em",
        0.0,
        2,
        50.0,
    )
    assert summary["supplied"]["fides"]["n"] == 0 and summary["supplied"]["fides"]["score"] is None
    assert summary["true_conflict"]["standard"]["ci_vs_standard"] is None
    with pytest.raises(ValueError, match="standard"):
        summarize_strata(records, strata, ["fides"])


def test_strata_markdown_lists_every_stratum_and_method():
    records = [_record(0, "q0", True, {"standard": "Paris", "fides": "Lyon"})]
    results = {
        "available": {"true_conflict": 1},
        "per_stratum": 5,
        "seed": 3,
        "results": summarize_strata(records, {"r0": "true_conflict"}, ["standard", "fides"], samples=10),
    }
    text = strata_markdown(results)
    assert "true_conflict 1, supplied 0" in text and "seed 3" in text
    assert re.search(r"^\| true_conflict +\| +fides \| +1 \| +1 \| +CF 100\.0 \|", text, re.MULTILINE)
    assert re.search(r"^\| true_conflict +\| +fides .*\| +0 \(0\.0%\) \| +1 \(100\.0%\) \|", text, re.MULTILINE)


def test_score_metric_is_cf_on_conflict_strata_and_em_on_agreeing_ones():
    assert [score_metric(s) for s in STRATA] == ["cf", "cf", "em", "em"]
    with pytest.raises(ValueError, match="unknown stratum"):
        score_metric("conflict")


def test_a_folder_with_answers_of_a_run_without_strata_is_refused(tmp_path):
    check_strata_folder(tmp_path)  # empty: fine
    (tmp_path / "predictions.jsonl").write_text('{"id": "a", "outputs": {}}\n')
    (tmp_path / "run.json").write_text(json.dumps({"model": "m"}))
    with pytest.raises(ValueError, match="without strata.*'strata' key"):
        check_strata_folder(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"model": "m", "strata": {"seed": 0}}))
    check_strata_folder(tmp_path)


def test_results_without_strata_are_refused():
    with pytest.raises(ValueError, match="no strata results.*--strata"):
        check_strata_results({"metrics": {}})
    assert check_strata_results({"strata": {"results": {}}}) == {"results": {}}


PASSAGE = "Lyon, not Marseille, hosts it."


def _conflict_rows():
    """Three true-conflict rows of two questions, with standard's and FIDES's answers, and their examples."""
    records = [
        _record(0, "q0", True, {"standard": "Paris", "fides": "Lyon"}),
        _record(1, "q0", True, {"standard": "Marseille", "fides": "Lyon, I think"}),
        _record(2, "q1", True, {"standard": "Lyon", "fides": "Nice"}),
    ]
    examples = [QAExample(r["question"], (PASSAGE,), ("Lyon",), ("Paris",), r["id"], {}, ("Paris",)) for r in records]
    return records, examples, {r["id"]: "true_conflict" for r in records}


def test_summary_counts_distinct_questions_and_each_methods_failures_by_class():
    records, examples, strata = _conflict_rows()
    summary = summarize_strata(records, strata, ["standard", "fides"], samples=20, examples=examples)
    standard, fides = summary["true_conflict"]["standard"], summary["true_conflict"]["fides"]
    assert (standard["n"], standard["questions"]) == (3, 2)
    assert standard["failures"] == {"memorised": 1, "no_stop": 0, "other_span": 1, "other": 0}
    assert fides["failures"] == {"memorised": 0, "no_stop": 1, "other_span": 0, "other": 1}
    assert summary["supplied"]["fides"] == {**summary["supplied"]["fides"], "n": 0, "questions": 0}
    assert summary["supplied"]["fides"]["failures"] == dict.fromkeys(("memorised", "no_stop", "other_span", "other"), 0)
    without = summarize_strata(records, strata, ["standard", "fides"], samples=20)
    assert without["true_conflict"]["fides"]["failures"] is None and without["true_conflict"]["fides"]["questions"] == 2


def test_strata_counts_are_the_summarys_rows_questions_and_failures_without_statistics():
    records, examples, strata = _conflict_rows()
    summary = summarize_strata(records, strata, ["standard", "fides"], samples=20, examples=examples)
    counts = strata_counts(records, strata, ["standard", "fides"], examples)
    assert counts == {
        s: {m: {k: e[k] for k in ("n", "questions", "failures")} for m, e in methods.items()}
        for s, methods in summary.items()
    }


def test_questions_per_stratum_count_each_question_once():
    examples = [_example(0, True, "q0"), _example(1, True, "q0"), _example(2, False, "q0"), _example(3, True, "q1")]
    strata = {"r0": "true_conflict", "r1": "true_conflict", "r2": "known_agreeing", "r3": "supplied"}
    assert count_strata_questions(examples, strata) == {
        "true_conflict": 1,
        "supplied": 1,
        "known_agreeing": 1,
        "unknown_agreeing": 0,
    }


def _strata_results(scored: int) -> dict:
    records, examples, strata = _conflict_rows()
    return {
        "available": {"true_conflict": 3},
        "available_questions": {"true_conflict": 2},
        "scored": {"true_conflict": scored, "supplied": 0, "known_agreeing": 0, "unknown_agreeing": 0},
        "results": summarize_strata(records, strata, ["standard", "fides"], samples=20, examples=examples),
    }


def test_strata_markdown_gives_rows_questions_and_failure_classes_with_standards_memorised():
    text = strata_markdown(_strata_results(scored=3))
    assert "true_conflict 3 (2 questions), supplied 0 (0 questions)" in text
    assert re.search(r"^\| stratum +\| +method \| +n \| +questions \| +score \|", text, re.MULTILINE)
    assert re.search(r"^\| true_conflict +\| +fides \| +3 \| +2 \| +CF 33\.3 \|", text, re.MULTILINE)
    head = r"^\| stratum +\| +method \| +n \| +right \| +failures \| +memorised \| +no stop \| +other span \| +other \|"
    assert re.search(head, text, re.MULTILINE)
    assert re.search(
        r"^\| true_conflict +\| +standard \| +3 \| +1 \| +2 \| +1 \| +0 \| +1 \| +0 \|", text, re.MULTILINE
    )
    assert "Partial run" not in text


def test_strata_markdown_without_failure_classes_has_no_failure_table():
    records, _, strata = _conflict_rows()
    results = {"available": {}, "results": summarize_strata(records, strata, ["standard", "fides"], samples=20)}
    assert "memorised" not in strata_markdown(results)


def test_a_run_missing_answers_on_scored_rows_is_marked_partial():
    results = _strata_results(scored=5)
    assert missing_answers(results) == ["standard: 3 of 5 true_conflict rows", "fides: 3 of 5 true_conflict rows"]
    text = strata_markdown(results)
    assert text.startswith("**Partial run**: these figures cover only the rows answered so far, not the whole run")
    assert "fides: 3 of 5 true_conflict rows" in text.splitlines()[0]
    assert missing_answers(_strata_results(scored=3)) == [] and missing_answers({"results": {}}) == []
