"""Fast tests of the noisy-retrieval demo: metric, noise injection, recall@k, splitting, corpora, CLI."""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

import pytest

from fides_rag.demo import (
    contains_alias,
    inject_noise,
    is_correct,
    load_embedded_corpus,
    load_popqa_corpus,
    noise_count,
    normalize_answer,
    recall_at_k,
    split_passage,
)
from fides_rag.demo.cli import _noise, add_demo_parser, settings_from_args
from fides_rag.demo.corpus import resolve_popqa_folder
from fides_rag.demo.run import DemoSettings, format_table, level_label, plot_accuracy, select_questions
from fides_rag.result import GenerationResult, StepRecord

# -- accuracy metric ----------------------------------------------------------------------------


def test_normalize_answer_is_squad_style():
    assert normalize_answer("  The Eiffel-Tower, in ROME!  ") == "eiffeltower in rome"  # SQuAD deletes punctuation
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("") == ""


@pytest.mark.parametrize(
    ("prediction", "aliases", "expected"),
    [
        ("Rome, Italy.", ["Rome"], True),
        ("It is in the city of rome", ["Rome"], True),
        ("Paris", ["Rome"], False),
        ("political activist", ["pol"], False),  # whole tokens only
        ("He was a politician.", ["politician", "pol"], True),
        ("1889", ["8"], False),
        ("Vincent van Gogh painted it", ["van Gogh"], True),
        ("The Nile River.", ["River Nile", "Nile"], True),
        ("", ["Rome"], False),
        ("Rome", [""], False),  # an empty alias never matches
    ],
)
def test_is_correct(prediction, aliases, expected):
    assert is_correct(prediction, aliases) is expected


# -- noise injection -----------------------------------------------------------------------------

DOCS = [f"retrieved doc {i} about the topic" for i in range(10)]
POOL = [
    f"pool passage {i} mentions Rome" if i % 3 == 0 else f"pool passage {i} is irrelevant" for i in range(40)
] + DOCS[:3]
SHARES = (0.0, 0.2, 0.5)


def _inject(docs=DOCS, seed=7, key="q1", shares=SHARES, **kw):
    return inject_noise(docs, shares, POOL, ["Rome"], seed=seed, key=key, **kw)


def test_noise_count_rounds_half_up():
    assert [noise_count(s, 4) for s in SHARES] == [0, 1, 2]
    assert [noise_count(s, 10) for s in SHARES] == [0, 2, 5]
    assert noise_count(0.5, 5) == 3 and noise_count(1.0, 3) == 3
    with pytest.raises(ValueError):
        noise_count(1.5, 4)


def test_zero_noise_leaves_documents_unchanged():
    level = _inject()[0]
    assert level.share == 0.0 and list(level.documents) == DOCS and level.replaced == ()


def test_share_of_documents_is_replaced_with_alias_free_new_documents():
    for level in _inject():
        n = noise_count(level.share, len(DOCS))
        changed = [i for i, (a, b) in enumerate(zip(DOCS, level.documents)) if a != b]
        assert len(changed) == n and list(level.replaced) == changed
        new = [level.documents[i] for i in changed]
        assert all(not contains_alias(d, ["Rome"]) for d in new)
        assert all(d not in DOCS for d in new)  # never a document that was already retrieved
        assert len(set(level.documents)) == len(DOCS)


def test_noise_is_seeded_reproducible_and_varies_with_seed_and_question():
    assert _inject() == _inject()
    positions = {_inject(seed=s)[2].replaced for s in range(20)}
    assert len(positions) > 5  # positions are random, not e.g. always the tail
    assert any(_inject(key=f"q{i}")[2].replaced != _inject()[2].replaced for i in range(2, 10))


def test_noise_levels_are_nested():
    low, high = _inject()[1], _inject()[2]
    assert set(low.replaced) <= set(high.replaced)
    for i in low.replaced:
        assert low.documents[i] == high.documents[i]


def test_protect_gold_replaces_gold_documents_last():
    docs = ["Rome is the answer"] + DOCS[1:4]
    for seed in range(10):
        level = inject_noise(docs, (0.5,), POOL, ["Rome"], seed=seed, key="q", protect_gold=True)[0]
        assert 0 not in level.replaced and level.documents[0] == "Rome is the answer"


def test_noise_needs_enough_clean_distractors():
    with pytest.raises(ValueError, match="irrelevant"):
        inject_noise(DOCS, (0.5,), ["Rome one", "Rome two"], ["Rome"], seed=0, key="q")


# -- recall@k -------------------------------------------------------------------------------------


def test_recall_at_k():
    retrieved = [["nothing", "Rome here"], ["Paris", "Lyon"], ["Berlin is it"]]
    aliases = [["Rome"], ["Rome"], ["Berlin"]]
    assert recall_at_k(retrieved, aliases) == pytest.approx(2 / 3)
    assert recall_at_k(retrieved, aliases, k=1) == pytest.approx(1 / 3)
    assert recall_at_k([], []) == 0.0
    with pytest.raises(ValueError):
        recall_at_k(retrieved, aliases[:2])


# -- corpus splitting -----------------------------------------------------------------------------


def test_split_passage_strips_hash_and_packs_sentences():
    text = "#Alpha is one. Beta is two! Gamma is three? Delta is four."
    assert split_passage(text, max_words=100) == ["Alpha is one. Beta is two! Gamma is three? Delta is four."]
    chunks = split_passage(text, max_words=6)
    assert chunks == ["Alpha is one. Beta is two!", "Gamma is three? Delta is four."]
    assert " ".join(chunks) == text[1:]
    assert split_passage("#") == [] and split_passage("   ") == []


def test_split_passage_keeps_long_sentence_whole_and_not_on_abbreviations_lowercase():
    long = "word " * 30 + "end."
    assert split_passage(long, max_words=10) == [long.strip()]
    assert split_passage("Born 1818 in Hampstead. He was e.g. a politician.", max_words=4) == [
        "Born 1818 in Hampstead.",
        "He was e.g. a politician.",
    ]


# -- the embedded corpus ---------------------------------------------------------------------------


def test_embedded_corpus_is_well_formed():
    corpus = load_embedded_corpus()
    passages = {p.id: p.text for p in corpus.passages}
    assert 40 <= len(corpus.questions) <= 60
    assert len(passages) == len(corpus.passages)  # unique ids
    assert len({p.text for p in corpus.passages}) == len(corpus.passages)
    assert len({q.id for q in corpus.questions}) == len(corpus.questions)
    kinds = Counter(q.meta["kind"] for q in corpus.questions)
    assert set(kinds) == {"counterfactual", "longtail", "factual"} and min(kinds.values()) >= 10
    for q in corpus.questions:
        assert q.question.endswith("?") and q.context_answers and all(a.strip() for a in q.context_answers)
        assert q.meta["answer_passages"], q.id
        for pid in q.meta["answer_passages"]:
            assert contains_alias(passages[pid], q.context_answers), (q.id, pid)
        if q.meta["kind"] == "counterfactual":
            # the document contradicts memory: it holds the gold answer, not the real-world one
            assert q.memory_answers
            assert not any(contains_alias(passages[pid], q.memory_answers) for pid in q.meta["answer_passages"]), q.id
            assert not set(map(normalize_answer, q.context_answers)) & set(map(normalize_answer, q.memory_answers))
    distractors = [p for p in corpus.passages if p.id.startswith("distractor")]
    assert len(distractors) >= 20
    for q in corpus.questions:  # enough alias-free passages to inject 50% noise at k=10
        clean = [p for p in corpus.passages if not contains_alias(p.text, q.context_answers)]
        assert len(clean) >= 20


def test_embedded_corpus_is_package_data():
    from importlib import resources

    path = resources.files("fides_rag.demo").joinpath("data", "demo_corpus.json")
    assert path.is_file()
    assert json.loads(path.read_text(encoding="utf-8"))["name"] == load_embedded_corpus().name


def test_select_questions_balances_kinds_and_is_seeded():
    corpus = load_embedded_corpus()
    chosen = select_questions(corpus, 24, seed=0)
    assert len(chosen) == 24 and Counter(q.meta["kind"] for q in chosen) == {
        "counterfactual": 8,
        "longtail": 8,
        "factual": 8,
    }
    assert chosen == select_questions(corpus, 24, seed=0)
    assert chosen != select_questions(corpus, 24, seed=1)
    assert select_questions(corpus, None, 0) == corpus.questions
    order = [corpus.questions.index(q) for q in chosen]
    assert order == sorted(order)


# -- PopQA loading ----------------------------------------------------------------------------------


def _write_popqa(folder):
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "question": "What is Ann Lee's occupation?",
            "answers": ["politician", "pol"],
            "prop": "occupation",
            "question_id": 0,
        },
        {
            "question": "In what city was Bo Ek born?",
            "answers": ["Uppsala"],
            "prop": "place of birth",
            "question_id": 1,
        },
    ]
    (folder / "popqa_longtail.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "popqa_longtail_passages.txt").write_text(
        "#Ann Lee was a politician. She lived in Leeds.\n#Bo Ek is a painter. He lives in Oslo. Ann Lee was a "
        "politician.\n"
    )


def test_load_popqa_corpus_from_folder_and_parent(tmp_path):
    _write_popqa(tmp_path / "popqa")
    for where in (tmp_path / "popqa", tmp_path):
        corpus = load_popqa_corpus(where, max_words=6)
        assert [q.id for q in corpus.questions] == ["popqa-0", "popqa-1"]
        texts = [p.text for p in corpus.passages]
        assert texts == [
            "Ann Lee was a politician.",
            "She lived in Leeds.",
            "Bo Ek is a painter.",
            "He lives in Oslo.",
        ]  # dedup
        assert corpus.questions[0].meta["answer_passages"] == ("popqa-0-0",)
        assert corpus.questions[1].meta["answer_passages"] == ()
        assert corpus.questions[0].meta["kind"] == "occupation"


def test_popqa_missing_says_where_it_looked(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as info:
        resolve_popqa_folder(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value) and "popqa_longtail.jsonl" in str(info.value)
    monkeypatch.setenv("FIDES_RAG_DATA", str(tmp_path / "envdata"))
    with pytest.raises(FileNotFoundError) as info:
        resolve_popqa_folder(None)
    assert str(tmp_path / "envdata" / "popqa") in str(info.value)
    _write_popqa(tmp_path / "envdata" / "popqa")
    assert resolve_popqa_folder(None) == tmp_path / "envdata" / "popqa"


def test_popqa_line_count_must_match(tmp_path):
    _write_popqa(tmp_path)
    (tmp_path / "popqa_longtail_passages.txt").write_text("#only one line\n")
    with pytest.raises(ValueError, match="line i"):
        load_popqa_corpus(tmp_path)


# -- CLI and report --------------------------------------------------------------------------------


def _parse(argv):
    parser = argparse.ArgumentParser(prog="fides-rag")
    add_demo_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["demo", *argv])


def test_cli_defaults_and_corpus_switch(monkeypatch):
    monkeypatch.delenv("FIDES_RAG_DATA", raising=False)
    settings = settings_from_args(_parse([]))
    assert settings == DemoSettings()
    assert settings.corpus == "demo" and settings.methods == ("standard", "cad", "adacad", "fides")
    assert settings.noise == (0.0, 0.2, 0.5) and settings.model == "gemma3-270m"
    assert settings_from_args(_parse(["--data", "/x"])).corpus == "popqa"
    assert settings_from_args(_parse(["--corpus", "popqa"])).data is None
    monkeypatch.setenv("FIDES_RAG_DATA", "/somewhere")
    assert settings_from_args(_parse([])).corpus == "popqa"
    assert settings_from_args(_parse(["--corpus", "demo"])).corpus == "demo"
    with pytest.raises(ValueError):
        settings_from_args(_parse(["--corpus", "demo", "--data", "/x"]))
    args = _parse(
        [
            "--k",
            "6",
            "--noise",
            "0,50",
            "--seed",
            "3",
            "--limit",
            "5",
            "--model",
            "smollm2-135m-instruct",
            "--out",
            "o",
            "--methods",
            "standard,fides",
            "--batch-size",
            "2",
        ]
    )
    s = settings_from_args(args)
    assert (s.k, s.noise, s.seed, s.limit, s.model, s.out, s.methods, s.batch_size) == (
        6,
        (0.0, 0.5),
        3,
        5,
        "smollm2-135m-instruct",
        "o",
        ("standard", "fides"),
        2,
    )


def test_cli_noise_parsing():
    assert _noise("0,0.2,0.5") == (0.0, 0.2, 0.5)
    assert _noise("0,20,50") == (0.0, 0.2, 0.5)
    assert _noise("0%,20%,50%") == (0.0, 0.2, 0.5)
    assert _noise("1") == (1.0,)
    for bad in ("", "x", "0,150"):
        with pytest.raises(argparse.ArgumentTypeError):
            _noise(bad)
    with pytest.raises(SystemExit):
        _parse(["--methods", "nope"])


def test_missing_popqa_exits_with_a_clear_message(tmp_path, capsys):
    from fides_rag.demo.cli import run_demo_command

    assert run_demo_command(_parse(["--data", str(tmp_path / "missing"), "--quiet"])) == 2
    err = capsys.readouterr().err
    assert "PopQA long-tail data not found" in err and str(tmp_path / "missing") in err


def test_table_and_plot(tmp_path):
    levels = [level_label(s) for s in (0.0, 0.2, 0.5)]
    report = {
        "corpus": {"name": "c"},
        "questions": 4,
        "model": "m",
        "k": 4,
        "seed": 0,
        "recall_at_k": 75.0,
        "noise_levels": levels,
        "noise_counts": dict(zip(levels, (0, 1, 2))),
        "drop_between": ["0%", "50%"],
        "methods": ["standard", "fides"],
        "accuracy": {"standard": dict(zip(levels, (75.0, 50.0, 25.0))), "fides": dict(zip(levels, (75.0, 75.0, 50.0)))},
        "drop": {"standard": 50.0, "fides": 25.0},
        "answer_in_documents": dict(zip(levels, (100.0, 75.0, 50.0))),
    }
    table = format_table(report)
    assert "recall@4: 75.0%" in table and "standard" in table and "+50.0" in table and "50%" in table
    assert "gold doc" in table
    path = plot_accuracy(report, tmp_path / "a.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


# -- run_demo with a stub retriever and decoder: checkpointing and significance --------------------


class _StubRetriever:
    """The k passages that share most words with the question (no embeddings: logic only)."""

    def __init__(self, corpus):
        self.passages = corpus.passages
        self.embedder = argparse.Namespace(name="stub")
        self.from_cache, self.cache_path = True, "nowhere"

    def search(self, questions, k):
        def overlap(q, p):
            return len(set(q.lower().split()) & set(p.text.lower().split()))

        return [
            [(p, float(overlap(q, p))) for p in sorted(self.passages, key=lambda p: -overlap(q, p))[:k]]
            for q in questions
        ]


class _StubDecoder:
    """Answers with the first document's first word; counts what it was asked to decode."""

    def __init__(self, fail_after_batches=None):
        self.calls: list[tuple[int, tuple[str, ...]]] = []
        self.fail_after_batches = fail_after_batches

    def generate_batch(self, questions, documents, *, methods, max_new_tokens):
        if self.fail_after_batches is not None and len(self.calls) >= self.fail_after_batches:
            raise KeyboardInterrupt
        self.calls.append((len(questions), tuple(methods)))
        return {m: [_answer(docs[0].split()[0], m) for docs in documents] for m in methods}


def _answer(text, method):
    return GenerationResult(
        text=text,
        token_ids=[1],
        steps=[StepRecord(token_id=1, token=text)],
        method=method,
        requested_method=method,
        method_options={},
        finish_reason="stop",
        context_prompt="",
        no_context_prompt=None,
    )


def _demo(tmp_path, **kw):
    from fides_rag.demo.run import run_demo

    settings = DemoSettings(out=str(tmp_path / "run"), limit=6, batch_size=4, **kw)
    return lambda decoder: run_demo(
        settings, decoder=decoder, retriever=_StubRetriever(load_embedded_corpus()), progress=False, log=lambda _: None
    )


def test_interrupted_demo_resumes_without_redecoding(tmp_path):
    run = _demo(tmp_path, methods=("standard", "fides"))
    with pytest.raises(KeyboardInterrupt):
        run(_StubDecoder(fail_after_batches=2))
    lines = (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 8  # two batches of 4 prompts survived the interruption

    resumed = _StubDecoder()
    report = run(resumed)
    assert sum(n for n, _ in resumed.calls) == 18 - 8  # 6 questions x 3 levels, minus what was kept
    assert report["decoded_before"] == 8 and report["decoded_now"] == 10

    fresh = _demo(tmp_path / "fresh", methods=("standard", "fides"))(_StubDecoder())
    assert fresh["accuracy"] == report["accuracy"]
    assert [q["levels"] for q in fresh["per_question"]] == [q["levels"] for q in report["per_question"]]


def test_demo_with_an_extra_method_decodes_only_that_method(tmp_path):
    _demo(tmp_path, methods=("standard", "fides"))(_StubDecoder())
    extra = _StubDecoder()
    report = _demo(tmp_path, methods=("standard", "cad", "fides"))(extra)
    assert {methods for _, methods in extra.calls} == {("cad",)}
    assert sum(n for n, _ in extra.calls) == 18
    assert set(report["accuracy"]) == {"standard", "cad", "fides"}
    record = json.loads((tmp_path / "run" / "predictions.jsonl").read_text().splitlines()[-1])
    assert set(record["outputs"]) == {"standard", "cad", "fides"}


def test_demo_refuses_to_resume_a_run_of_another_model(tmp_path):
    _demo(tmp_path)(_StubDecoder())
    with pytest.raises(ValueError, match="different model.*new --out"):
        _demo(tmp_path, model="smollm2-135m-instruct")(_StubDecoder())


def test_demo_report_has_paired_bootstrap_against_fides(tmp_path):
    report = _demo(tmp_path)(_StubDecoder())
    sig = report["significance"]
    assert sig["reference"] == "fides" and set(sig["versus"]) == {"standard", "cad", "adacad"}
    pair = sig["versus"]["standard"]
    assert set(pair["accuracy"]) == {"0%", "20%", "50%"}
    assert pair["accuracy"]["0%"]["diff"] == 0.0  # the stub answers the same under every method
    assert pair["drop"]["n"] == 6
    assert "paired bootstrap, fides − other" in format_table(report)
    markdown = (tmp_path / "run" / "results.md").read_text()
    assert re.search(r"\| method +\| +0% \| +20% \| +50% \| +drop 0% → 50% \|", markdown)
    assert re.search(r"^\| standard +\| ", markdown, re.M) and re.search(
        r"\| fides vs +\| +0% \| +20% \| +50% \| +drop \|", markdown
    )
    assert "+0.0 [+0.0, +0.0], p = 1" in markdown  # identical answers: no difference, not significant
    assert "on the prompts that still hold a gold passage" in markdown


def test_accuracy_given_gold_counts_only_prompts_with_an_answering_passage(tmp_path):
    report = _demo(tmp_path)(_StubDecoder())
    for method in report["methods"]:
        for level in report["noise_levels"]:
            flags = [
                q["levels"][level]["predictions"][method]["correct"]
                for q in report["per_question"]
                if q["levels"][level]["gold_in_documents"]
            ]
            expected = 100.0 * sum(flags) / len(flags) if flags else None
            assert report["accuracy_given_gold"][method][level] == (pytest.approx(expected) if flags else None)


def test_compare_methods_by_hand():
    from fides_rag.demo.run import compare_methods

    correct = {
        "fides": [[True, True, False, True], [True, False, False, True]],
        "standard": [[True, False, False, True], [False, False, False, True]],
    }
    sig = compare_methods(correct, ["standard", "fides"], ["0%", "50%"])
    assert sig["versus"]["standard"]["accuracy"]["0%"]["diff"] == pytest.approx(25.0)
    assert sig["versus"]["standard"]["accuracy"]["50%"]["diff"] == pytest.approx(25.0)
    # drops: fides (0, 1, 0, 0), standard (1, 0, 0, 0) -> equal mean drop
    assert sig["versus"]["standard"]["drop"]["diff"] == pytest.approx(0.0)


def test_default_run_folder_is_per_corpus_and_model():
    assert str(DemoSettings().out_folder()) == "runs/demo/demo-gemma3-270m"
    assert (
        str(DemoSettings(corpus="popqa", model="HuggingFaceTB/SmolLM2-135M-Instruct").out_folder())
        == "runs/demo/popqa-HuggingFaceTB-SmolLM2-135M-Instruct"
    )
    assert str(DemoSettings(out="x/y").out_folder()) == "x/y"


def test_interrupted_demo_command_says_how_to_resume(tmp_path, monkeypatch, capsys):
    from fides_rag.demo import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fides_rag.demo.run.run_demo", interrupted)
    assert cli.run_demo_command(_parse(["--out", str(tmp_path / "r"), "--quiet"])) == 130
    assert f"answers so far are in {tmp_path / 'r'}; rerun the same command to resume" in capsys.readouterr().err
