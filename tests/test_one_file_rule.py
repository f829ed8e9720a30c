"""Proof that a new baseline is one file: this rule lives here alone, registers itself, needs the no-context
path, records a value of its own, and decodes through `generate` and `generate_batch(methods=...)` with nothing in
fides_rag/ changed for it."""

from __future__ import annotations

import pytest
import torch

from fides_rag import ContrastRule, FidesDecoder, register_method
from fides_rag.rules import StepInputs, StepOutput, registry
from fides_rag.rules.base import CONTEXT, NO_CONTEXT


class HalfContrast(ContrastRule):
    """z = 1.5·z_ctx − 0.5·z_noctx, recording the max-logit gap between the two paths as "logit_gap"."""

    paths = (CONTEXT, NO_CONTEXT)

    def combine(self, step: StepInputs) -> StepOutput:
        gap = step.ctx_logits.max(dim=-1).values - step.no_ctx_logits.max(dim=-1).values  # [B]
        return StepOutput(logits=1.5 * step.ctx_logits - 0.5 * step.no_ctx_logits, records={"logit_gap": gap})


@pytest.fixture
def registered():
    register_method("half-contrast")(HalfContrast)
    yield "half-contrast"
    registry.RULES.unregister("half-contrast")


def test_a_rule_defined_in_a_test_file_decodes_and_records(registered, tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    alone = decoder.generate(
        "What is the capital?", ["Lyon is the capital of France."], method=registered, max_new_tokens=5
    )
    assert alone.method == "half-contrast" and alone.no_context_prompt is not None
    assert all(set(step.values) == {"logit_gap"} for step in alone.steps)
    assert len(alone.steps) == len(alone.token_ids) > 0

    lanes = decoder.generate_batch(
        ["What is the capital?", "Who chose Canberra?"],
        [["Lyon is the capital of France."], ["Canberra was chosen as a compromise."]],
        methods=[registered, "cad", "standard"],
        max_new_tokens=5,
    )
    first = lanes["half-contrast"][0]
    assert first.token_ids == alone.token_ids
    assert [s.values["logit_gap"] for s in first.steps] == pytest.approx(
        [s.values["logit_gap"] for s in alone.steps], abs=1e-5
    )
    assert all(s.values == {} for s in lanes["standard"][0].steps)
    assert first.to_dict()["steps"][0]["logit_gap"] == first.steps[0].values["logit_gap"]


def test_the_recorded_value_is_what_combine_computed(registered, tiny_llama, tokenizer):
    """The recorded gap equals the gap of separate uncached forwards of the two prompts."""
    decoder = FidesDecoder(tiny_llama, tokenizer)
    example = decoder.prepare("What is the capital?", ["Lyon is the capital of France."], 1)
    with torch.no_grad():
        ctx = tiny_llama(torch.tensor([example.context_ids])).logits[0, -1]
        no = tiny_llama(torch.tensor([example.no_context_ids])).logits[0, -1]
    result = decoder.generate_batch([example], method=registered, max_new_tokens=1)[0]
    assert result.steps[0].values["logit_gap"] == pytest.approx(float(ctx.max() - no.max()), abs=1e-4)
