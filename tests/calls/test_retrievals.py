"""The run log that says which retrieved texts are a model call's context when a framework ran the retriever."""

from __future__ import annotations

from fides_rag.calls.retrievals import RunRetrievals

DOC, OTHER = "The Eiffel Tower is in Rome.", "Paris is in France."


def chain_with_a_retriever(log: RunRetrievals, texts: list[str], query: str = "Where is the Eiffel Tower?") -> None:
    log.start("chain", None)
    log.start("retrieval", "chain")
    log.start("retriever", "retrieval")
    log.asked("retrieval", query)
    log.retrieved("retrieval", texts)
    log.end("retriever", "retrieval")
    log.start("prompt", "chain")


def test_a_model_run_finds_the_texts_a_sibling_retriever_returned_in_its_prompt():
    log = RunRetrievals()
    chain_with_a_retriever(log, [DOC, OTHER, DOC, "  "])
    prompt = f"Context: {DOC}\nQuestion: Where is the Eiffel Tower?"
    assert log.documents_for("prompt", [prompt]) == [DOC]
    assert log.retrieved_for("prompt") == [DOC, OTHER]
    assert log.question_for("prompt", prompt) == "Where is the Eiffel Tower?"
    assert log.question_for("prompt", "another prompt") is None


def test_an_empty_retrieval_is_told_apart_from_no_retriever():
    empty = RunRetrievals()
    chain_with_a_retriever(empty, [])
    assert empty.retrieved_for("prompt") == [] and empty.documents_for("prompt", ["anything"]) == []
    none = RunRetrievals()
    none.start("chain", None)
    assert none.retrieved_for("chain") is None


def test_documents_given_as_a_run_input_are_filed_under_that_run_only():
    log = RunRetrievals()
    log.start("chain", None)
    log.start("stuff", "chain")
    log.retrieved("stuff", [DOC], ancestors=False)
    log.asked("stuff", "Where?", ancestors=False)
    assert log.documents_for("stuff", [DOC]) == [DOC] and log.question_for("stuff", "Where? ...") == "Where?"
    assert log.retrieved_for("chain") is None


def test_the_end_of_the_root_run_forgets_its_tree():
    log = RunRetrievals()
    chain_with_a_retriever(log, [DOC])
    log.end("prompt", "chain")
    assert log.documents_for("prompt", [DOC]) == [DOC]  # an inner run's end keeps the tree
    log.end("chain", None)
    assert log.documents_for("prompt", [DOC]) == [] and log.retrieved_for("prompt") is None


def test_a_log_past_its_size_starts_again():
    log = RunRetrievals(max_runs=3)
    chain_with_a_retriever(log, [DOC])
    log.start("late", None)
    assert log.retrieved_for("prompt") is None and log.retrieved_for("late") is None
