"""`fides-rag eval --strata` end to end on a tiny random model: closed-book lane, strata, row selection, refusals."""

import json
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from fides_rag.cli.main import main
from fides_rag.decoder import FidesDecoder
from fides_rag.eval.closed_book import CLOSED_BOOK
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.records import read_predictions
from fides_rag.eval.strata import STRATA
from fides_rag.eval.strata_run import read_strata_counts, run_strata_eval
from fides_rag.result import GenerationResult
from fides_rag.rules import get_method

QUESTIONS = [f"Which city is number {i}?" for i in range(4)]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from fides_rag.testing import build_tiny_model, build_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_tiny_model("llama", len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _examples(known: dict[str, str]) -> list[QAExample]:
    """Two rows per question (swapped and original passage); the original answer is the closed-book answer for the
    questions in `known`, something else for the others."""
    rows = []
    for i, question in enumerate(QUESTIONS):
        original = (known.get(question) or "Zanzibar",)
        rows.append(
            QAExample(
                question, ("Lyon is the capital.",), ("Lyon",), original, f"r{i}-c", {"form": "conflict"}, original
            )
        )
        rows.append(
            QAExample(question, ("Paris is the capital.",), original, (), f"r{i}-o", {"form": "original"}, original)
        )
    return rows


def test_strata_run_splits_rows_by_the_closed_book_answer_and_scores_each_against_standard(
    tokenizer, tiny_llama, tmp_path
):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    closed = {q: decoder.generate(q, [], method="standard", max_new_tokens=2).text for q in QUESTIONS[:2]}
    if not all(text.strip() for text in closed.values()):
        pytest.skip("the random model answered nothing closed-book")
    examples = _examples(closed)
    results = run_strata_eval(
        decoder,
        examples,
        {"standard": "standard", "fides": "fides"},
        tmp_path,
        model="tiny",
        max_new_tokens=2,
        batch_size=4,
        progress=False,
        bootstrap_samples=20,
    )
    strata = results["strata"]
    assert strata["available"] == dict.fromkeys(STRATA, 2) and strata["questions"] == 4
    assert set(strata["results"]) == set(STRATA)
    assert (
        strata["results"]["true_conflict"]["fides"]["n"] == 2
        and strata["results"]["true_conflict"]["fides"]["metric"] == "cf"
    )
    assert len((tmp_path / CLOSED_BOOK).read_text().splitlines()) == 4  # one line per distinct question
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["strata"]["results"]["known_agreeing"]["standard"]["n"] == 2
    assert json.loads((tmp_path / "run.json").read_text())["strata"]["seed"] == 0
    assert "Strata (closed-book lane" in (tmp_path / "results.md").read_text()


def test_per_stratum_scores_the_same_rows_for_every_method(tokenizer, tiny_llama, tmp_path):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    examples = _examples({})
    results = run_strata_eval(
        decoder,
        examples,
        {"standard": "standard", "cad": "cad"},
        tmp_path,
        model="tiny",
        per_stratum=1,
        seed=5,
        max_new_tokens=2,
        progress=False,
        bootstrap_samples=10,
    )
    records = read_predictions(tmp_path / "predictions.jsonl")
    assert len(records) == 2 and all(set(r["outputs"]) == {"standard", "cad"} for r in records)
    assert results["strata"]["scored"] == {
        "true_conflict": 0,
        "supplied": 1,
        "known_agreeing": 0,
        "unknown_agreeing": 1,
    }
    assert results["strata"]["per_stratum"] == 1 and results["run"]["strata"]["seed"] == 5


def _jsonl(path, memory=True):
    rows = [
        {
            "id": f"q{i}",
            "question": f"Which city is number {i}?",
            "contexts": ["Lyon is the capital."],
            "context_answers": ["Lyon"],
            **({"memory_answers": ["Paris"]} if memory else {}),
        }
        for i in range(2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(model, data, out, *extra):
    return [
        "eval",
        "--model",
        str(model),
        "--dataset",
        "jsonl",
        "--data",
        str(data),
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


def test_cli_strata_on_a_user_jsonl_writes_strata_results(tiny_folder, tmp_path):
    data = _jsonl(tmp_path / "qa.jsonl")
    assert main(_args(tiny_folder, data, tmp_path / "run", "--methods", "standard,fides", "--strata")) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert sum(results["strata"]["available"].values()) == 2
    assert results["strata"]["available"]["known_agreeing"] == 0  # every row has a swapped passage


def test_cli_strata_without_original_answers_names_the_field(tiny_folder, tmp_path, capsys):
    data = _jsonl(tmp_path / "qa.jsonl", memory=False)
    assert main(_args(tiny_folder, data, tmp_path / "run", "--methods", "standard,fides", "--strata")) == 2
    err = capsys.readouterr().err
    assert "--strata needs each row's original answer" in err and "memory_answers" in err and "original_answers" in err


def test_cli_strata_refuses_a_folder_of_a_run_without_strata(tiny_folder, tmp_path, capsys):
    data = _jsonl(tmp_path / "qa.jsonl")
    out = tmp_path / "run"
    assert main(_args(tiny_folder, data, out, "--methods", "standard")) == 0
    before = (out / "predictions.jsonl").read_text()
    assert main(_args(tiny_folder, data, out, "--methods", "standard", "--strata")) == 2
    assert "holds answers of a run without strata" in capsys.readouterr().err
    assert (out / "predictions.jsonl").read_text() == before


def test_cli_strata_needs_standard_and_per_stratum_needs_strata(tiny_folder, tmp_path, capsys):
    data = _jsonl(tmp_path / "qa.jsonl")
    assert main(_args(tiny_folder, data, tmp_path / "a", "--methods", "fides", "--strata")) == 2
    assert "add standard to --methods" in capsys.readouterr().err
    assert main(_args(tiny_folder, data, tmp_path / "b", "--methods", "standard", "--per-stratum", "3")) == 2
    assert "needs --strata" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_spec:
        main(_args(tiny_folder, data, tmp_path / "c", "--strata", "--per-stratum", "truth=3"))
    assert bad_spec.value.code == 2 and not (tmp_path / "c").exists()
    assert "unknown stratum 'truth'" in capsys.readouterr().err


def test_cli_strata_rerun_resumes_without_decoding_again_and_a_plain_run_is_refused(tiny_folder, tmp_path, capsys):
    data = _jsonl(tmp_path / "qa.jsonl")
    out = tmp_path / "run"
    argv = _args(
        tiny_folder, data, out, "--methods", "standard,cad", "--strata", "--per-stratum", "1", "--strata-seed", "4"
    )
    assert main(argv) == 0
    closed, predictions = (out / CLOSED_BOOK).read_text(), (out / "predictions.jsonl").read_text()
    assert main(argv) == 0
    assert (out / CLOSED_BOOK).read_text() == closed and (out / "predictions.jsonl").read_text() == predictions
    assert json.loads((out / "run.json").read_text())["strata"]["seed"] == 4
    capsys.readouterr()
    assert main(_args(tiny_folder, data, out, "--methods", "standard,cad")) == 2  # without --strata: never mixed
    assert "strata" in capsys.readouterr().err
    assert main([*argv[:-1], "5"]) == 2  # another seed would choose other rows
    assert "strata" in capsys.readouterr().err


def test_cli_counts_per_stratum_are_recorded_and_a_rerun_resumes(tiny_folder, tmp_path, capsys):
    data = _jsonl(tmp_path / "qa.jsonl")
    out = tmp_path / "run"
    argv = _args(tiny_folder, data, out, "--methods", "standard", "--strata", "--per-stratum", "1,true_conflict=2")
    assert main(argv) == 0
    recorded = json.loads((out / "run.json").read_text())["strata"]["per_stratum"]
    assert recorded == {"true_conflict": 2, "supplied": 1, "known_agreeing": 1, "unknown_agreeing": 1}
    predictions = (out / "predictions.jsonl").read_text()
    assert main(argv) == 0
    assert (out / "predictions.jsonl").read_text() == predictions
    assert "of true_conflict" in (out / "results.md").read_text()
    capsys.readouterr()
    assert main([*argv[:-1], "2"]) == 2  # other counts would choose other rows
    assert "strata" in capsys.readouterr().err


def test_a_finished_run_folder_is_read_again_for_rows_questions_and_failure_classes(write_strata_run, tmp_path):
    write_strata_run(tmp_path / "run")
    counts = read_strata_counts(tmp_path / "run")
    none = dict.fromkeys(("memorised", "no_stop", "other_span", "other"), 0)
    assert counts["true_conflict"]["standard"] == {"n": 1, "questions": 1, "failures": {**none, "memorised": 1}}
    assert counts["true_conflict"]["fides"]["failures"] == none  # right
    assert counts["known_agreeing"]["fides"]["failures"] == {**none, "no_stop": 1}
    assert counts["supplied"]["standard"]["failures"] == {**none, "other_span": 1}
    assert counts["supplied"]["fides"]["failures"] == {**none, "no_stop": 1}
    assert counts["unknown_agreeing"]["standard"]["failures"] == {**none, "other": 1}


def test_a_run_folder_whose_data_changed_or_is_gone_is_not_read_again(write_strata_run, tmp_path):
    write_strata_run(tmp_path / "run")
    with (tmp_path / "run" / "data.jsonl").open("a") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match="is not here as the run read it"):
        read_strata_counts(tmp_path / "run")
    (tmp_path / "run" / "data.jsonl").unlink()
    with pytest.raises(ValueError, match="is not here as the run read it"):
        read_strata_counts(tmp_path / "run")
    with pytest.raises(ValueError, match="holds no run.json"):
        read_strata_counts(tmp_path)


class _ScriptedDecoder:
    """Answers from a script, with no model: closed-book (no documents) by question, otherwise by method and passage."""

    def __init__(self, closed_book, answers):
        self.closed_book, self.answers = closed_book, answers

    def tokenizer(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}

    def rule_for(self, method):
        return get_method(method)

    class prompts:  # the decoder's `prompts` attribute
        @staticmethod
        def render(question, document_block):
            return f"Answer: {question}", []

    def submit(self, question, documents, *, max_new_tokens, method):
        future: Future = Future()
        future.set_result(_answer(self.closed_book[question], method))
        return SimpleNamespace(future=future, cancel=lambda: None)

    def generate_batch(self, questions, documents, *, max_new_tokens, methods):
        return {label: [_answer(self.answers[label][docs[0]], label) for docs in documents] for label in methods}


def _answer(text, method):
    return GenerationResult(text, [], [], method, method, {}, "stop", "", None)


def test_strata_results_count_questions_and_failure_classes_per_stratum_and_method(strata_rows, tmp_path):
    examples = [
        QAExample(q, (p,), tuple(c), tuple(m), i, {"form": "conflict" if m else "original"}, tuple(m or c))
        for i, q, p, c, m, _, _ in strata_rows
    ]
    answers = {"standard": {row[2]: row[5] for row in strata_rows}, "fides": {row[2]: row[6] for row in strata_rows}}
    decoder = _ScriptedDecoder({"Which city is the capital?": "Paris", "Who wrote it?": "I do not know"}, answers)
    methods = {"standard": "standard", "fides": "fides"}
    results = run_strata_eval(decoder, examples, methods, tmp_path, model="m", progress=False, bootstrap_samples=10)
    strata = results["strata"]
    assert strata["available_questions"] == strata["scored_questions"] == dict.fromkeys(STRATA, 1)
    none = dict.fromkeys(("memorised", "no_stop", "other_span", "other"), 0)
    assert strata["results"]["true_conflict"]["standard"]["failures"] == {**none, "memorised": 1}
    assert strata["results"]["supplied"]["standard"]["failures"] == {**none, "other_span": 1}
    assert strata["results"]["known_agreeing"]["fides"]["failures"] == {**none, "no_stop": 1}
    assert all(e["questions"] == 1 for methods in strata["results"].values() for e in methods.values())
    text = (tmp_path / "results.md").read_text()
    assert "true_conflict 1 (1 question)" in text and "Wrong answers by class" in text
    assert "Partial run" not in text


def test_with_a_count_for_every_stratum_the_lane_scans_a_seeded_prefix_of_the_questions(tmp_path):
    questions = [f"Which city is number {i}?" for i in range(40)]
    examples = []
    for i, question in enumerate(questions):
        original = ("Paris",)
        examples.append(QAExample(question, ("Lyon.",), ("Lyon",), original, f"c{i}", {"form": "conflict"}, original))
        examples.append(QAExample(question, ("Paris.",), original, (), f"o{i}", {"form": "original"}, original))
    closed_book = {q: "Paris" if i % 2 else "no idea" for i, q in enumerate(questions)}
    answers = {label: {"Lyon.": "Lyon", "Paris.": "Paris"} for label in ("standard", "fides")}
    decoder = _ScriptedDecoder(closed_book, answers)
    methods = {"standard": "standard", "fides": "fides"}
    results = run_strata_eval(
        decoder,
        examples,
        methods,
        tmp_path,
        model="m",
        per_stratum=3,
        seed=1,
        closed_book_in_flight=1,
        progress=False,
        bootstrap_samples=10,
    )
    strata = results["strata"]
    assert strata["questions"] == 40 and 6 <= strata["scanned_questions"] < 40
    assert (
        strata["scored"] == dict.fromkeys(STRATA, 3)
        and strata["scan"] == "seeded shuffle, until every stratum has its rows"
    )
    assert min(strata["available"].values()) == 3  # stopped at the first question that completed a stratum
    cached = (tmp_path / CLOSED_BOOK).read_text().splitlines()
    assert len(cached) == strata["scanned_questions"]  # one request in flight at a time here: nothing beyond
