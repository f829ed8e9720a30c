"""fides-rag's template leftovers in answers ("Document [2]: ..."): the stops, and the cleaning every front door gets
from the core."""

from __future__ import annotations

from fides_rag.prompts.template import PromptTemplate, TemplateLeftovers, template_stops


def test_template_stops_are_the_templates_line_heads_after_a_newline():
    stops = template_stops(PromptTemplate())
    assert stops[:2] == ("\nDocument [", "\nQuestion:")
    assert "\nUsing only the references listed above, answer the following question:" in stops
    assert all(s.startswith("\n") for s in stops)  # an answer is never cut to nothing
    custom = PromptTemplate(document_format="[{index}] {text}", question_format="Q: {question}")
    assert template_stops(custom)[:2] == ("\n[", "\nQ:")


def test_template_leftovers_cleaned_from_answers_and_held_back_from_streams():
    leftovers = TemplateLeftovers(PromptTemplate())
    # measured on smollm2-135m-instruct with CAD: the answer began by copying a document label
    assert leftovers.clean("Document [2]: The Colosseum is in Rome, Italy.") == (
        "The Colosseum is in Rome, Italy.",
        ["removed the template leftover 'Document [2]:' from the start of the answer"],
    )
    assert leftovers.clean("Rome\nUsing only", truncated=True) == (
        "Rome",
        ["removed the start of a template line '\\nUsing only' from the end of the truncated answer"],
    )
    assert leftovers.clean("Rome\nUsing only") == ("Rome\nUsing only", [])  # only a truncated end is cut
    for answer in ("Rome", "Documents say Rome", "Document [1] is wrong: Rome", "Docs"):
        assert leftovers.clean(answer, truncated=True) == (answer, [])
    assert leftovers.clean("Document [", truncated=True)[0] == ""
    # streaming: a possible label is held back until it is decided, then dropped
    growing = ["Doc", "Document [", "Document [12", "Document [12]: Ro", "Document [12]: Rome\nQue"]
    assert [leftovers.visible(t) for t in growing] == ["", "", "", "Ro", "Rome"]
    assert leftovers.visible("Rome, Italy") == "Rome, Italy"
