"""fit_texts: the one trimming rule shared by the decoder's template and the integrations' prompts."""

from __future__ import annotations

import pytest

from fides_rag.prompts.template import ContextWindowExceeded, context_text, fit_texts


def _count(tokenizer):
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_fitting_prompt_is_untouched(tokenizer):
    texts = {"a": "Lyon is the capital of France.", "b": "Paris is large."}
    fitted = fit_texts(texts, lambda t: "Q: " + " ".join(t.values()), _count(tokenizer), 10_000, tokenizer)
    assert not fitted.trimmed and fitted.texts == texts and fitted.rendered == "Q: " + " ".join(texts.values())


def test_longest_text_is_cut_first_until_the_prompt_fits(tokenizer):
    count = _count(tokenizer)
    short, long = "Paris is large.", "The quick brown fox jumps over the lazy dog 0123456789. " * 6
    render = lambda t: "Question: " + t["short"] + " " + t["long"]  # noqa: E731
    full = count(render({"short": short, "long": long}))
    budget = full - 12
    fitted = fit_texts({"short": short, "long": long}, render, count, budget, tokenizer)
    assert count(fitted.rendered) <= budget
    assert fitted.texts["short"] == short and long.startswith(fitted.texts["long"]) and fitted.texts["long"] != long
    assert fitted.trimmed and fitted.tokens_after < fitted.tokens_before
    assert "trimmed from" in fitted.note(8, 512)


def test_prompt_that_cannot_fit_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="does not fit even without its documents"):
        fit_texts(
            {"doc": "Lyon is the capital of France."},
            lambda t: "A long fixed question " * 5 + t["doc"],
            _count(tokenizer),
            3,
            tokenizer,
        )


def test_a_prompt_that_cannot_fit_says_by_how_much_so_a_server_names_what_to_shorten(tokenizer):
    question = "A long fixed question " * 5
    with pytest.raises(ContextWindowExceeded) as err:
        fit_texts(
            {"doc": "Lyon."}, lambda t: question + t["doc"], _count(tokenizer), 3, tokenizer, max_new_tokens=2**64
        )
    assert (err.value.tokens, err.value.max_new_tokens, err.value.context_window) == (
        _count(tokenizer)(question),
        2**64,
        3 + 2**64,
    )


def test_a_mapping_of_documents_is_refused_not_read_as_its_keys(tokenizer, tiny_llama):
    from fides_rag import FidesDecoder
    from fides_rag.prompts.template import document_texts

    with pytest.raises(
        TypeError, match=r"documents is a mapping \(dict with keys \['text'\]\).*pass a list of documents"
    ):
        document_texts({"text": "Lyon is the capital of France."})
    with pytest.raises(TypeError, match="documents is a mapping"):
        FidesDecoder(tiny_llama, tokenizer).generate(
            "Which city?", {"text": "Lyon is the capital of France."}, max_new_tokens=1
        )
    assert document_texts([{"text": "x"}.get("text")]) == ["x"]


def test_a_context_value_becomes_one_text():
    class Node:
        text = "Paris is large."

    assert context_text(None) == "" and context_text("  as given ") == "  as given "
    assert (
        context_text(["Lyon.", Node(), " "], "|") == "Lyon.|Paris is large."
        and context_text(Node()) == "Paris is large."
    )
