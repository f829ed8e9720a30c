"""An answer's text cut of what is not the answer: a copied document label, a <tool_call> wrapper around a plain
answer, the next turn's role line; and a growing answer shown without them."""

from __future__ import annotations

import pytest

from fides_rag.prompts.answer_text import AnswerText
from fides_rag.prompts.template import PromptTemplate


@pytest.mark.parametrize(
    "raw, cut",
    [
        ("Rome.\nUser", "Rome."),  # measured on gemma3-270m: the answer ended with the next turn's role line
        ("Rome.\nUser: and where is Paris?", "Rome."),
        ("Rome.\n assistant:", "Rome."),
        ("Rome.\nHuman:\nHi", "Rome."),
        ("<tool_call>\nRome, Italy.\n</tool_call>", "Rome, Italy."),  # measured on gemma3-270m
        ("<tool_call>Rome", "Rome"),
        ("Rome</tool_call>", "Rome"),
    ],
)
def test_markup_and_role_lines_are_cut_with_a_note(raw, cut):
    text, notes = AnswerText().clean(raw)
    assert text == cut and len(notes) == 1


@pytest.mark.parametrize(
    "answer",
    [
        "Rome",
        "Users of the tower: 7 million a year.",
        "Rome.\nUsers say so.",
        "User: Rome",
        '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>',  # a call: the tool parser reads it
        '<tool_call>\n{"name": "search", "argu',  # the start of one
        "<tool_call>a</tool_call>\n<tool_call>b</tool_call>",
    ],
)
def test_answers_and_calls_are_left_as_they_are(answer):
    assert AnswerText().clean(answer) == (answer, [])


def test_a_copied_label_is_cut_only_under_fides_rags_template():
    assert AnswerText(PromptTemplate()).clean("Document [2]: Rome.\nUser") == (
        "Rome.",
        [
            "removed the template leftover 'Document [2]:' from the start of the answer",
            "removed the next turn's role line 'User' from the end of the answer",
        ],
    )
    assert AnswerText().clean("Document [2]: Rome.")[0] == "Document [2]: Rome."


def test_a_truncated_answer_loses_the_start_of_a_role_line():
    assert AnswerText().clean("Rome.\nUs", truncated=True)[0] == "Rome."
    assert AnswerText().clean("Rome.\nUs")[0] == "Rome.\nUs"  # it ended there: kept


def test_a_growing_answer_holds_back_what_may_be_cut():
    shown = AnswerText()
    assert [shown.visible(t) for t in ["<tool", "<tool_call>Ro", "<tool_call>Rome</tool_call>"]] == ["", "", ""]
    assert [shown.visible(t) for t in ["Rome", "Rome.\nUs", "Rome.\nUser", "Rome.\nUsers", "Rome</tool"]] == [
        "Rome",
        "Rome.",
        "Rome.",
        "Rome.\nUsers",
        "Rome",
    ]
    labelled = AnswerText(PromptTemplate())
    assert [labelled.visible(t) for t in ["Docu", "Document [1]: Ro", "Document [1]: Rome\nUser"]] == ["", "Ro", "Rome"]
