"""The path table: it names every path a rule can ask for, in the batch's row order, and a path kind added to it
alone (no other decoder file) is prefilled, decoded, gathered and read by a rule."""

from __future__ import annotations

import pytest

from fides_rag import ContrastRule, FidesDecoder
from fides_rag.generation.paths import PATH_KINDS, PathKind
from fides_rag.rules import StepOutput, available_methods, get_method
from fides_rag.rules.base import CONTEXT, PATHS
from fides_rag.testing import SAMPLE_DOCUMENTS, SAMPLE_QUESTIONS

SPARE = "context_again"


class SpareProbe(ContrastRule):
    """Decodes from the context path and records how far the spare path's logits are from it."""

    name = "spare-probe"
    paths = (CONTEXT, SPARE)

    def combine(self, step):
        gap = (step.logits[SPARE] - step.ctx_logits).abs().amax(dim=-1)  # [B]
        return StepOutput(logits=step.ctx_logits, records={"gap": gap})


def test_the_table_holds_every_path_the_rules_can_ask_for_in_row_order():
    assert tuple(PATH_KINDS)[: len(PATHS)] == PATHS
    for name in available_methods():
        assert set(get_method(name).paths) <= set(PATH_KINDS), name


def test_a_path_kind_added_to_the_table_flows_through_a_decode(tiny_llama, tokenizer, monkeypatch):
    monkeypatch.setitem(PATH_KINDS, SPARE, PathKind(SPARE, lambda example: [example.context_ids]))
    decoder = FidesDecoder(tiny_llama, tokenizer, method="standard")
    question, documents = SAMPLE_QUESTIONS[0], SAMPLE_DOCUMENTS[0]

    probed = decoder.generate(question, documents, method=SpareProbe(), max_new_tokens=6, stop=[])
    alone = decoder.generate(question, documents, max_new_tokens=6, stop=[])

    assert probed.token_ids == alone.token_ids
    gaps = [step.values["gap"] for step in probed.steps]
    assert len(gaps) == len(probed.token_ids) and max(gaps) < 1e-4


def test_a_rule_reading_a_path_the_table_lacks_is_refused_naming_it(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer, method="standard")
    with pytest.raises(ValueError, match=f"method 'spare-probe' reads path '{SPARE}'.*paths are 'context'"):
        decoder.generate(SAMPLE_QUESTIONS[0], SAMPLE_DOCUMENTS[0], method=SpareProbe(), max_new_tokens=2)
    assert decoder.stats.requests_in_flight == 0
