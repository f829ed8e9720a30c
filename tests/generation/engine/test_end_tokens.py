"""The engine hands a rule that reads them the ids that end its answers (`StepInputs.end_tokens`): EOS ids, none while
`min_new_tokens` holds EOS back, and the tokens holding a stop string; in exact mode, fast mode and fast mode's
compiled combine. `fides-stop` decodes through it: FIDES's tokens until the context path ranks an end token first,
then that end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fides_rag import FidesDecoder, PromptTemplate, register_method
from fides_rag.rules import ContrastRule, StepInputs, StepOutput, registry

QUESTION = "What is the capital of France?"
DOCUMENTS = ["Lyon is the capital of France.", "Paris is a large city on the Seine."]
MODES: dict[str, dict[str, Any]] = {
    "exact": {"mode": "exact"},
    "fast": {"mode": "fast"},
    "fast-compiled": {"mode": "fast", "compile": "eager"},
}
"""Decoder settings by label: fast-compiled runs each greedy lane's combine through torch.compile."""


class EndTokensSeen(ContrastRule):
    """CAD with a = 1 that never picks an end token, recording how many end tokens it was handed and their sum."""

    reads_end_tokens = True

    def combine(self, step: StepInputs) -> StepOutput:
        assert step.end_tokens is not None
        logits = (2 * step.ctx_logits - step.require("no_ctx_logits")).index_fill(1, step.end_tokens, float("-inf"))
        rows = logits.shape[0]
        seen = {
            "end_count": torch.full((rows,), step.end_tokens.numel(), dtype=logits.dtype, device=logits.device),
            "end_sum": step.end_tokens.sum().to(logits.dtype).expand(rows),
        }
        return StepOutput(logits=logits, records=seen)


@pytest.fixture
def end_tokens_seen() -> Iterator[str]:
    register_method("test-end-tokens-seen")(EndTokensSeen)
    yield "test-end-tokens-seen"
    registry.RULES.unregister("test-end-tokens-seen")


def decoder(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, label: str, eos_token_ids: set[int]
) -> FidesDecoder:
    """A decoder of `MODES[label]` whose answers end only at `eos_token_ids` (no stop strings)."""
    built = FidesDecoder(model, tokenizer, prompt_template=PromptTemplate(stop=()), **MODES[label])
    built.eos_token_ids = eos_token_ids
    return built


@pytest.mark.parametrize("label", list(MODES))
def test_the_engine_hands_the_rule_the_end_tokens_once_they_can_end_the_answer(
    tiny_llama: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, end_tokens_seen: str, label: str
) -> None:
    decoding = decoder(tiny_llama, tokenizer, label, {5, 9})
    result = decoding.generate(QUESTION, DOCUMENTS, method=end_tokens_seen, max_new_tokens=5, min_new_tokens=2)
    assert len(result.steps) == 5
    assert [s.values["end_count"] for s in result.steps] == [0, 0, 2, 2, 2]
    assert [s.values["end_sum"] for s in result.steps] == [0, 0, 14, 14, 14]
    assert_compiled_where_asked(decoding, label)


def assert_compiled_where_asked(decoding: FidesDecoder, label: str) -> None:
    """Under fast-compiled, some lane steps ran the compiled combine and none fell back to eager."""
    if label == "fast-compiled":
        assert decoding.stats.captured_combine_lanes > 0 and decoding.stats.captured_combine_fallbacks == 0


def context_tops(model: PreTrainedModel, prompt_ids: list[int], answer: list[int]) -> list[int]:
    """The context path's top token before each answer token, from uncached forwards of the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + answer])).logits[0]  # [T, V]
    return logits[len(prompt_ids) - 1 :].argmax(dim=-1).tolist()[: len(answer)]


@pytest.mark.parametrize("label", list(MODES))
def test_fides_stop_is_fides_where_the_context_path_never_ranks_an_end_first(
    tiny_llama: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, label: str
) -> None:
    decoding = decoder(tiny_llama, tokenizer, label, {1})
    fides = decoding.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=6)
    stop = decoding.generate(QUESTION, DOCUMENTS, method="fides-stop", max_new_tokens=6)
    assert [s.values["kept_end"] for s in stop.steps] == [0.0] * len(stop.steps)
    assert stop.token_ids == fides.token_ids and stop.finish_reason == fides.finish_reason
    assert_compiled_where_asked(decoding, label)
    for mine, theirs in zip(stop.steps, fides.steps):
        assert mine.values["alpha"] == pytest.approx(theirs.values["alpha"], abs=1e-6)


@pytest.mark.parametrize("label", list(MODES))
def test_fides_stop_ends_where_fides_overrides_the_context_paths_end(
    tiny_llama: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, label: str
) -> None:
    """Make the context path's top token at the first step where FIDES departs from it the only end token: FIDES
    goes on past it, fides-stop ends there."""
    free = decoder(tiny_llama, tokenizer, label, set())
    fides = free.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=6).token_ids
    prompt = free.prepare(QUESTION, DOCUMENTS, 1).context_ids
    tops = context_tops(tiny_llama, prompt, fides)
    departs = next(k for k, (top, token) in enumerate(zip(tops, fides)) if top != token)
    end = tops[departs]
    assert end not in fides[:departs] and end not in tops[:departs]  # nothing ends the answer earlier

    ending = decoder(tiny_llama, tokenizer, label, {end})
    stop = ending.generate(QUESTION, DOCUMENTS, method="fides-stop", max_new_tokens=6)
    assert stop.token_ids == [*fides[:departs], end] and stop.finish_reason == "eos"
    assert [s.values["kept_end"] for s in stop.steps] == [0.0] * departs + [1.0]
    assert_compiled_where_asked(ending, label)
    goes_on = ending.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=6)
    assert goes_on.token_ids[: departs + 1] == fides[: departs + 1] and len(goes_on.token_ids) > departs + 1


def test_tokens_holding_a_stop_string_end_the_answer_beside_the_eos_ids() -> None:
    from fides_rag.generation.engine.end_tokens import EndTokens

    texts = ["a", "\n", "b\n\n", "c", ".\n", "END"]
    decoded: list[int] = []

    def decode_token(ids: list[int]) -> str:
        decoded.extend(ids)
        return texts[ids[0]]

    ends = EndTokens(decode_token)
    assert ends.stop_ids(("\n",), len(texts)) == (1, 2, 4)
    assert ends.stop_ids(("\n", "END"), len(texts)) == (1, 2, 4, 5)
    assert len(decoded) == len(texts)  # the vocabulary is decoded once


def test_a_rule_that_does_not_read_end_tokens_gets_none(
    tiny_llama: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    seen: list[object] = []

    class Plain(ContrastRule):
        paths = ("context",)
        contrasts = False

        def combine(self, step: StepInputs) -> StepOutput:
            seen.append(step.end_tokens)
            return StepOutput(logits=step.ctx_logits)

    FidesDecoder(tiny_llama, tokenizer).generate(QUESTION, DOCUMENTS, method=Plain(), max_new_tokens=2)
    assert seen and all(ends is None for ends in seen)
