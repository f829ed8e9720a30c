"""The tokens that end an answer (`StepInputs.end_tokens`), for the rules that read them: a request's EOS ids and every
token whose text holds one of its stop strings (the template's newline, the user's `stop`). The vocabulary is scanned
once per set of stop strings, and one device tensor is kept per (EOS ids, stop strings, device).

A stop string that only completes across two tokens (the first half already decoded) is not an end token here: the
engine's stop matching still ends the answer there, after the rule has chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fides_rag.generation.engine.layout import Unit


class EndTokens:
    """Which token ids end the answers of a group of units, as one [K] long tensor on the logits' device."""

    def __init__(self, decode_token: Callable[[list[int]], str]) -> None:
        self._decode_token = decode_token
        self._texts: list[str] | None = None
        self._stop_ids: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._tensors: dict[tuple[tuple[int, ...], tuple[str, ...], int, torch.device], torch.Tensor] = {}

    def stop_ids(self, stops: tuple[str, ...], vocab: int) -> tuple[int, ...]:
        """The ids below `vocab` whose decoded text holds one of `stops` (the vocabulary is decoded once)."""
        if stops not in self._stop_ids:
            if self._texts is None or len(self._texts) < vocab:
                self._texts = [self._decode_token([token]) for token in range(vocab)]
            found = [i for i, text in enumerate(self._texts[:vocab]) if any(s and s in text for s in stops)]
            self._stop_ids[stops] = tuple(found)
        return self._stop_ids[stops]

    def for_units(self, units: Sequence[Unit], vocab: int, device: torch.device) -> torch.Tensor:
        """[K] long: the EOS ids of the units that may end now (not held back by `min_new_tokens`) and the tokens
        holding any unit's stop string."""
        eos = tuple(sorted({e for u in units if len(u.generated) >= u.min_new_tokens for e in u.eos_ids if e < vocab}))
        stops = tuple(sorted({s for u in units for s in u.stop}))
        key = (eos, stops, vocab, device)
        if key not in self._tensors:
            ids = sorted(set(eos) | set(self.stop_ids(stops, vocab)))
            self._tensors[key] = torch.tensor(ids, dtype=torch.long, device=device)
        return self._tensors[key]
