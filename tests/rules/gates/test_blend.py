"""The blending gate against a float64 hand computation: a bounded mixture of the two paths where the context path is
confident, the rule elsewhere."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import available_gates, get_gate, get_method
from fides_rag.decoder import FidesDecoder
from fides_rag.rules import StepInputs
from fides_rag.rules.gates import MEMORY_LEANING, RULE, BlendGate


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    return [e / sum(exps) for e in exps]


def step(ctx: list[list[float]], no_ctx: list[list[float]]) -> StepInputs:
    return StepInputs.from_tensors(torch.tensor(ctx, dtype=torch.float64), torch.tensor(no_ctx, dtype=torch.float64))


# row 0: the context path is sure of token 0 (margin 0.75); row 1: it is torn between tokens 0 and 1 (margin 0).
CTX = [[3.0, 0.5, 0.0], [1.0, 1.0, 0.0]]
NO_CTX = [[0.0, 2.0, 1.0], [2.0, 0.0, 0.0]]


def test_a_confident_context_path_gets_the_mixture_of_both_distributions():
    decision = BlendGate(context_weight=0.6, kappa=0.1).decide(step(CTX, NO_CTX))
    assert decision.choice.tolist() == [MEMORY_LEANING, RULE]
    for row in range(2):
        want = [math.log(0.6 * c + 0.4 * p) for c, p in zip(softmax(CTX[row]), softmax(NO_CTX[row]))]
        assert decision.logits[row].tolist() == pytest.approx(want, abs=1e-12)


def test_the_mixture_stays_between_the_two_paths():
    decision = BlendGate(context_weight=0.3, kappa=0.0).decide(step(CTX, NO_CTX))
    mixed = decision.logits.exp()
    ctx, prior = (
        torch.tensor(CTX, dtype=torch.float64).softmax(-1),
        torch.tensor(NO_CTX, dtype=torch.float64).softmax(-1),
    )
    assert torch.all(mixed >= torch.minimum(ctx, prior) - 1e-12) and torch.all(
        mixed <= torch.maximum(ctx, prior) + 1e-12
    )
    assert mixed.sum(-1).tolist() == pytest.approx([1.0, 1.0], abs=1e-12)


@pytest.mark.parametrize("weight, path", [(1.0, CTX), (0.0, NO_CTX)])
def test_the_end_weights_take_one_path_as_it_is(weight, path):
    decision = BlendGate(context_weight=weight, kappa=0.0).decide(step(CTX, NO_CTX))
    want = torch.tensor(path, dtype=torch.float64).log_softmax(-1)
    assert torch.allclose(decision.logits, want, atol=1e-12)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"context_weight": 1.5}, "context_weight"),
        ({"context_weight": -0.1}, "context_weight"),
        ({"kappa": 2.0}, "kappa"),
        ({"kappa": True}, "kappa"),
    ],
)
def test_options_outside_zero_one_are_refused_naming_them(options, field):
    with pytest.raises(ValueError, match=rf"blend: {field} must be a number in \[0, 1\]"):
        BlendGate(**options)


def test_blend_is_registered_by_name_and_composes_with_a_rule():
    assert "blend" in available_gates()
    assert get_gate("blend", context_weight=0.5).options() == {"context_weight": 0.5, "kappa": 0.05}
    assert get_method("fides+blend").gate.name == "blend"


def test_a_blended_fides_decodes_and_records_the_gates_choice(tokenizer, tiny_llama):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    result = decoder.generate(
        "What is the capital of France?", ["Lyon is the capital of France."], method="fides+blend", max_new_tokens=4
    )
    gates = [s.to_dict().get("gate") for s in result.steps]
    assert gates and all(g in (RULE, MEMORY_LEANING) for g in gates)
