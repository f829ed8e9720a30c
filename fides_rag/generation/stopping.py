"""When a unit stops: an EOS id, a stop string (of any token length, across token boundaries), the user's
stopping criteria, or the token budget.

Stop strings are matched on the host, in the text each unit decodes incrementally (`detokenize.py`): each step
searches only its new characters, so the whole answer is never decoded again. Not with transformers'
`StopStringCriteria`: its per-vocabulary tables are built per tokenizer and stop list (costly for 262k-token
vocabularies, and stop lists differ per request), and its verdict is a device tensor that would need a second
host transfer per step, while the chosen ids are already on the host for streaming. EOS is checked on those
host ids for the same reason (`EosTokenCriteria` would be one more device tensor)."""

from __future__ import annotations

from collections.abc import Sequence

from fides_rag.generation.engine.layout import Unit
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


def stop_found(unit: Unit) -> bool:
    """Whether a stop string ends in the text `unit` decoded since the last check (searching only the new
    characters and the longest stop's reach back into the old ones)."""
    text = unit.text.text
    reach = max(len(s) for s in unit.stop) - 1
    found = first_stop_index(text[max(0, unit.stop_scanned - reach) :], unit.stop) is not None
    unit.stop_scanned = len(text)
    return found


def finish_reason(unit: Unit, eos_token_ids: set[int], criteria_hit: bool) -> FinishReason | None:
    """Why `unit` stops after its latest token, or None if it goes on. A structured answer the budget made close
    early is complete (its grammar accepts it): it ends as any complete answer does ("eos", or "stop" where it
    reached its budget complete), never for "length"; `closed_early` tells the budget closed it."""
    grammar = unit.grammar
    if unit.generated[-1] in eos_token_ids:
        return "eos"
    if grammar is not None and grammar.is_terminated():
        return "stop"  # a stop token the grammar admitted as its end
    if unit.stop and stop_found(unit):
        return "stop"
    if criteria_hit:
        return "criteria"
    if len(unit.generated) >= unit.max_new_tokens:
        return "stop" if grammar is not None and grammar.closed_early and grammar.is_complete() else "length"
    return None
