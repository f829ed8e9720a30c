"""When a unit stops: an EOS id, a stop string (of any token length, across token boundaries), the user's
stopping criteria, or the token budget.

Stop strings are matched on the decoded text on the host, not with transformers' `StopStringCriteria`: its
per-vocabulary tables are built per tokenizer and stop list (costly for 262k-token vocabularies, and stop
lists differ per call), and its verdict is a device tensor that would need a second host transfer per step,
while the chosen ids are already on the host for streaming. EOS is checked on those host ids for the same
reason (`EosTokenCriteria` would be one more device tensor)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fides_rag.generation.layout import Unit
from fides_rag.result import FinishReason


def first_stop_index(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def held_back_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-length:]):
                longest = max(longest, length)
                break
    return longest


def finish_reason(
    unit: Unit, eos_token_ids: set[int], decode: Callable[[list[int]], str], criteria_hit: bool, max_new_tokens: int
) -> FinishReason | None:
    """Why `unit` stops after its latest token, or None if it goes on."""
    if unit.generated[-1] in eos_token_ids:
        return "eos"
    if unit.stop and first_stop_index(decode(unit.generated), unit.stop) is not None:
        return "stop"
    if criteria_hit:
        return "criteria"
    if len(unit.generated) >= max_new_tokens:
        return "length"
    return None
