"""Why an answer fails: every prediction in exactly one answer class, on the normalisation every metric uses
(`metrics.normalize_answer`).

The classes, the first that applies (precedence right > memorised > no_stop > other_span > other):

- `right`: the prediction equals an expected answer (EM; what CF and EM count as right);
- `memorised`: it equals a memory answer, the original answer the passage contradicts (what MemR counts);
- `no_stop`: an expected answer occurs in it as whole tokens (Acc), but it says more: the model gave the right answer
  and did not stop;
- `other_span`: it is a run of whole tokens of a passage the model saw, and none of the above (the wrong part of the
  passage);
- `other`: anything else: words from neither passage nor memory, or an empty answer.

Every class but `right` is a failure. On a row whose passage agrees with memory there are no memory answers, so no
answer there is `memorised`. Standard decoding's `memorised` failures bound what any contrast against memory can
fix: the other failures are not memory winning over the passage.

A `no_stop` answer of a contrast is set beside standard decoding's answer on the same row (the context path alone),
for why it did not stop (`no_stop_cause`, the first that applies):

- `standard_runs_on`: standard's answer does not stop there either (it is `no_stop` too, or ran to the token limit):
  the context path itself goes on;
- `past_standard_end`: it holds standard's tokens up to standard's end token and goes on: the contrast overrode the
  end the context path chose (what a stop-aware variant prevents);
- `diverged_first`: it left standard's tokens before standard's end, so that end was never on offer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fides_rag.eval.metrics import contains_answer, exact_match

ANSWER_CLASSES = ("right", "memorised", "no_stop", "other_span", "other")
"""Every class, in precedence order."""
FAILURE_CLASSES = ANSWER_CLASSES[1:]
"""The classes of a wrong answer."""


def is_passage_span(prediction: str, passages: Sequence[str]) -> bool:
    """Whether the normalised prediction, not empty, is a run of whole tokens of some normalised passage."""
    return any(contains_answer(passage, [prediction]) for passage in passages)


def answer_class(
    prediction: str, answers: Sequence[str], memory_answers: Sequence[str], passages: Sequence[str]
) -> str:
    """The class of one prediction (see the module docstring): `answers` are the expected (context) answers,
    `memory_answers` the original answers the passage contradicts (empty on an agreeing row), `passages` the
    passages the model saw."""
    if exact_match(prediction, answers):
        return "right"
    if exact_match(prediction, memory_answers):
        return "memorised"
    if contains_answer(prediction, answers):
        return "no_stop"
    if is_passage_span(prediction, passages):
        return "other_span"
    return "other"


NO_STOP_CAUSES = ("standard_runs_on", "past_standard_end", "diverged_first")
"""Why a `no_stop` answer did not stop, against standard's answer on the row (see the module docstring)."""


def no_stop_cause(
    token_ids: Sequence[int], standard_ids: Sequence[int], standard_class: str, standard_finish: str | None
) -> str:
    """The cause (`NO_STOP_CAUSES`) of a `no_stop` answer of `token_ids`, given standard's answer on the same row: its
    tokens (its end token last), its answer class and its finish reason."""
    if standard_class not in ANSWER_CLASSES:
        raise ValueError(f"unknown answer class {standard_class!r}; the classes are {', '.join(ANSWER_CLASSES)}")
    if standard_class == "no_stop" or standard_finish == "length":
        return "standard_runs_on"
    before_end = list(standard_ids[:-1])
    if list(token_ids[: len(before_end)]) == before_end:
        return "past_standard_end"
    return "diverged_first"


def count_failures(classes: Iterable[str]) -> dict[str, int]:
    """failure class -> how many of `classes` fall in it, for each failure class (0 where none); `right` is left out."""
    counted = dict.fromkeys(FAILURE_CLASSES, 0)
    for name in classes:
        if name not in ANSWER_CLASSES:
            raise ValueError(f"unknown answer class {name!r}; the classes are {', '.join(ANSWER_CLASSES)}")
        if name in counted:
            counted[name] += 1
    return counted
