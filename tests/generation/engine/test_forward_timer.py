"""`FidesDecoder.around_forwards(ForwardTimer(...))` times every decode step's backbone forward alone, in both modes
and on a captured step, and nothing once it is closed."""

from __future__ import annotations

import pytest
import torch

from fides_rag import FidesDecoder, ForwardTimer, PromptTemplate

QUESTION, DOCUMENTS = "Where is the Eiffel Tower?", ["The Eiffel Tower is in Rome."]


@pytest.mark.parametrize(
    "options", [{"mode": "exact"}, {"mode": "fast"}, {"mode": "fast", "compile": "eager", "buckets": [1, 2]}]
)
def test_each_decode_forward_is_timed_once_while_the_timer_is_installed(tiny_llama, tokenizer, options):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()), **options)
    timer = ForwardTimer(torch.device("cpu"))
    forced = {"method": "standard", "max_new_tokens": 5, "min_new_tokens": 5}
    with decoder.around_forwards(timer):
        assert len(decoder.generate(QUESTION, DOCUMENTS, **forced).token_ids) == 5
    assert len(timer) == 4  # the first token comes from the prefill; each later one from one decode forward
    assert all(ms > 0 for ms in timer.times_ms())
    decoder.generate(QUESTION, DOCUMENTS, **forced)
    assert len(timer) == 4  # closed: later forwards are not timed
