"""Fixtures for the core suite; the factories live in fides_rag.testing."""

from __future__ import annotations

import pytest

from fides_rag.testing import FAMILIES, build_tiny_model, build_tokenizer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a slow test first, each file's tests kept together and in order: `make test` deals whole files to
    its workers in this order, so the long files start early and the workers finish together instead of one waiting
    on the last long file."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def chat_tokenizer():
    return build_tokenizer(chat=True)


@pytest.fixture(scope="session")
def tiny_models(tokenizer):
    """family -> tiny random-weight model (shared; tests must not modify it)."""
    return {family: build_tiny_model(family, len(tokenizer)) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_gemma3(tiny_models):
    return tiny_models["gemma3_text"]


STRATA_ROWS = [  # (id, question, passage, context answers, memory answers, standard's answer, fides's answer)
    ("c0", "Which city is the capital?", "The capital is Lyon, near Vienne.", ["Lyon"], ["Paris"], "Paris", "Lyon"),
    ("o0", "Which city is the capital?", "The capital is Paris.", ["Paris"], [], "Paris", "The capital is Paris."),
    ("c1", "Who wrote it?", "It was written by Ann Lee in Rome.", ["Ann Lee"], ["Bo Ray"], "Rome", "Ann Lee wrote it"),
    ("o1", "Who wrote it?", "It was written by Bo Ray.", ["Bo Ray"], [], "Ann Lee", "Bo Ray"),
]
"""A finished strata run's rows: the model knew the capital closed-book, not the writer, so c0 is a true conflict, o0
known-agreeing, c1 supplied and o1 unknown-agreeing."""


@pytest.fixture
def strata_rows():
    """STRATA_ROWS: (id, question, passage, context answers, memory answers, standard's answer, fides's answer)."""
    return STRATA_ROWS


@pytest.fixture
def write_strata_run():
    """A function that writes a finished strata run of STRATA_ROWS into a folder, as `fides-rag eval --strata` leaves
    it (run.json, closed_book.jsonl, predictions.jsonl; its dataset, a jsonl, beside them), without a model; it
    returns the folder's prediction records."""
    import json

    from fides_rag.eval.closed_book import question_key
    from fides_rag.eval.metrics import score_prediction
    from fides_rag.eval.store import files_sha256

    def write(folder):
        folder.mkdir(parents=True)
        data = folder / "data.jsonl"
        rows = [
            {
                "id": i,
                "question": q,
                "contexts": [p],
                "context_answers": c,
                "memory_answers": m,
                "original_answers": m or c,
            }
            for i, q, p, c, m, _, _ in STRATA_ROWS
        ]
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        strata = {"seed": 0, "per_stratum": None, "known_by": "containment", "closed_book": "closed_book.jsonl"}
        info = {"model": "tiny", "dataset": "jsonl", "data": str(data), "data_files": [str(data)]}
        info |= {"data_sha256": files_sha256([data]), "max_new_tokens": 8, "methods": ["standard", "fides"]}
        (folder / "run.json").write_text(json.dumps({**info, "strata": strata}))
        closed = {"Which city is the capital?": "Paris", "Who wrote it?": "I do not know"}
        (folder / "closed_book.jsonl").write_text(
            "".join(
                json.dumps({"key": question_key("tiny", q), "model": "tiny", "max_new_tokens": 8, "answer": a}) + "\n"
                for q, a in closed.items()
            )
        )
        records = [
            {
                "id": i,
                "question": q,
                "context_answers": c,
                "memory_answers": m,
                "outputs": {
                    label: {"text": text, "method": label, "steps": [{}], "scores": score_prediction(text, c, m)}
                    for label, text in (("standard", standard), ("fides", fides))
                },
            }
            for i, q, _, c, m, standard, fides in STRATA_ROWS
        ]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return records

    return write
