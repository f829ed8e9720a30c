"""A transformers LogitsProcessor that constrains `model.generate` with grammars from `generation.grammar`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

from fides_rag.generation.grammar.constraint import GrammarConstraint, GrammarState, mask_logits_rows


class GrammarLogitsProcessor(LogitsProcessor):
    """Masks each row of `generate`'s scores with its own grammar state, accepting the token `generate` appended
    since the last call. One processor serves one `generate` call (greedy or sampling; not beam search).

        processor = GrammarLogitsProcessor(GrammarConstraint.compile(tokenizer, json_schema=Answer))
        out = model.generate(**inputs, logits_processor=[processor], max_new_tokens=64)
    """

    def __init__(self, constraints: GrammarConstraint | Sequence[GrammarConstraint]):
        self.constraints = constraints
        self.states: list[GrammarState] | None = None
        self._length = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if self.states is None:
            constraints = (
                [self.constraints] * rows if isinstance(self.constraints, GrammarConstraint) else list(self.constraints)
            )
            if len(constraints) != rows:
                raise ValueError(f"{len(constraints)} grammars for a batch of {rows} rows")
            self.states = [c.start() for c in constraints]
        elif length != self._length + 1:
            raise ValueError("a GrammarLogitsProcessor serves one generate call: make a new one for each call")
        else:
            for state, token in zip(self.states, input_ids[:, -1].tolist()):
                if not state.is_terminated():  # rows past EOS get padding appended
                    state.accept(token)
        self._length = length
        return mask_logits_rows(self.states, scores)  # type: ignore[return-value]  # transformers types it FloatTensor
