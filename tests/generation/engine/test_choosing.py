"""EOS held back below min_new_tokens, for every row at once, gives what transformers' processor gives row by row."""

from __future__ import annotations

import torch
from transformers import MinNewTokensLengthLogitsProcessor

from fides_rag.generation.engine.choosing import hold_eos
from fides_rag.generation.engine.layout import Unit


def unit(generated: int, min_new_tokens: int, eos: tuple[int, ...] = (3, 7)) -> Unit:
    return Unit(
        ticket=None,
        index=0,
        rows={},
        prompt_ids=[1, 2, 4],
        stop=(),
        max_new_tokens=10,
        text=None,
        min_new_tokens=min_new_tokens,
        eos_ids=eos,
        generated=[5] * generated,
    )


def test_eos_is_held_back_on_exactly_the_rows_transformers_processor_holds_it_back():
    units = [unit(0, 2), unit(2, 2), unit(1, 3), unit(4, 0), unit(0, 5, eos=())]
    scores = torch.randn(len(units), 12, generator=torch.Generator().manual_seed(0))
    got = hold_eos(scores, units)
    for i, u in enumerate(units):
        history = torch.tensor([u.prompt_ids + u.generated])
        expected = scores[i : i + 1]
        if u.eos_ids:
            processor = MinNewTokensLengthLogitsProcessor(len(u.prompt_ids), u.min_new_tokens, list(u.eos_ids))
            expected = processor(history, expected)
        assert torch.equal(got[i : i + 1], expected), i
    assert torch.isinf(got[0, [3, 7]]).all() and not torch.isinf(got[1]).any()
    assert torch.equal(scores, torch.randn(len(units), 12, generator=torch.Generator().manual_seed(0)))  # untouched


def test_no_row_below_its_minimum_leaves_the_scores_as_they_are():
    scores = torch.zeros(2, 8)
    assert hold_eos(scores, [unit(3, 2), unit(0, 0)]) is scores
