"""The gates against float64 hand computations: GRD's agreement gate with its once-per-sequence decision, NWCAD's
two stages, the composition with a rule, and the refusals of a bad spelling."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import GatedRule, available_gates, get_gate, get_method
from fides_rag.rules import StepInputs, parse_method_names
from fides_rag.rules.fides import FidesRule
from fides_rag.rules.gates import CONTEXT_AS_IS, MEMORY_LEANING, NO_CONTEXT_AS_IS, RULE, AgreeGate, DeferGate, NwcadGate


def log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    total = sum(math.exp(v - top) for v in row)
    return [v - top - math.log(total) for v in row]


def entropy(row: list[float]) -> float:
    return -sum(math.exp(lp) * lp for lp in log_softmax(row))


def step(ctx: list[list[float]], no_ctx: list[list[float]], state: list[list[float]] | None = None) -> StepInputs:
    inputs = StepInputs.from_tensors(torch.tensor(ctx, dtype=torch.float64), torch.tensor(no_ctx, dtype=torch.float64))
    inputs.state = None if state is None else torch.tensor(state, dtype=torch.float64)
    return inputs


# row 0: both paths' argmax is token 0; row 1: they disagree and memory is sure (p = 0.98, low entropy);
# row 2: they disagree and memory is unsure.
CTX = [[3.0, 1.0, 0.0], [0.5, 1.0, 0.0], [2.0, 0.0, 0.0]]
NO_CTX = [[2.0, 0.0, 1.0], [6.0, 1.0, 0.0], [0.0, 0.3, 0.0]]


def test_agree_gate_keeps_agreeing_tokens_and_decides_whom_to_trust_at_the_first_disagreement():
    decision = AgreeGate().decide(step(CTX, NO_CTX))
    assert decision.choice.tolist() == [CONTEXT_AS_IS, MEMORY_LEANING, RULE]
    assert decision.state[:, 0].tolist() == [0.0, 2.0, 1.0]  # undecided, memory trusted, context trusted
    assert torch.equal(decision.logits[0], torch.tensor(CTX[0], dtype=torch.float64))
    # row 1: GRD's blend tau * log p_ctx + (1 - tau) * log p_noctx with tau = 0.25 * tau*
    lc, lp = log_softmax(CTX[1]), log_softmax(NO_CTX[1])
    m_c, m_p = lc[1] - lc[0], lp[0] - lp[1]
    tau = 0.25 * m_p / (m_c + m_p)
    want = [tau * a + (1 - tau) * b for a, b in zip(lc, lp)]
    assert decision.logits[1].tolist() == pytest.approx(want, abs=1e-12)
    assert entropy(NO_CTX[1]) < entropy(CTX[1]) and math.exp(max(lp)) > 0.5


def test_agree_gate_never_revisits_its_decision():
    context_trusted = AgreeGate().decide(
        step([CTX[1]], [NO_CTX[1]], state=[[1.0]])
    )  # memory would win, but it is decided
    assert context_trusted.choice.tolist() == [RULE] and context_trusted.state.tolist() == [[1.0]]
    memory_trusted = AgreeGate().decide(step([CTX[2]], [NO_CTX[2]], state=[[2.0]]))
    assert memory_trusted.choice.tolist() == [MEMORY_LEANING] and memory_trusted.state.tolist() == [[2.0]]
    agreeing = AgreeGate().decide(step([CTX[0]], [NO_CTX[0]], state=[[2.0]]))
    assert agreeing.choice.tolist() == [CONTEXT_AS_IS]


def test_nwcad_gate_stages():
    # row 0: near-equal paths, memory sure -> the no-context path; row 1: the paths differ, context sure -> the context
    # path; row 2: the paths differ and the context is torn between two tokens -> the rule.
    ctx = [[5.0, 0.0, 0.0], [0.0, 6.0, 0.0], [1.0, 1.01, -3.0]]
    no_ctx = [[5.1, 0.0, 0.0], [6.0, 0.0, 0.0], [-3.0, 1.0, 4.0]]
    decision = NwcadGate().decide(step(ctx, no_ctx))
    assert decision.choice.tolist() == [NO_CONTEXT_AS_IS, CONTEXT_AS_IS, RULE]
    assert torch.equal(decision.logits[0], torch.tensor(no_ctx[0], dtype=torch.float64))
    assert torch.equal(decision.logits[1], torch.tensor(ctx[1], dtype=torch.float64))
    strict = NwcadGate(tau=0.0, kappa_context=1.0).decide(step(ctx, no_ctx))
    assert strict.choice.tolist() == [RULE, RULE, RULE]


def test_defer_gate_takes_the_context_path_where_it_departs_from_memory_and_the_rule_where_they_agree():
    decision = DeferGate().decide(step(CTX, NO_CTX))
    assert decision.choice.tolist() == [RULE, CONTEXT_AS_IS, CONTEXT_AS_IS]
    assert torch.equal(decision.logits, torch.tensor(CTX, dtype=torch.float64)) and decision.state is None


def test_gated_rule_takes_the_rule_where_the_gate_leaves_it_and_records_who_chose():
    inputs = step(CTX, NO_CTX)
    plain = FidesRule(weights=(1.0, 0.0, 0.0)).combine(inputs)
    gated = get_method("fides", weights=(1.0, 0.0, 0.0), gate="agree")
    out = gated.combine(step(CTX, NO_CTX))
    assert out.records["gate"].tolist() == [CONTEXT_AS_IS, MEMORY_LEANING, RULE]
    assert torch.equal(out.logits[2], plain.logits[2]) and torch.equal(out.logits[0], inputs.ctx_logits[0])
    assert torch.equal(out.records["alpha"], plain.records["alpha"])  # the rule's own records, as it computed them
    assert out.state.tolist() == [[0.0], [2.0], [1.0]]


def test_gates_are_spelled_rule_plus_gate_everywhere_a_method_is_named():
    assert available_gates()[:4] == ["none", "agree", "nwcad", "defer"]
    rule = get_method("fides+agree")
    assert isinstance(rule, GatedRule) and rule.name == "fides+agree" and rule.needs_no_context
    assert get_method("cad+nwcad", alpha=0.5).rule.alpha == 0.5
    assert type(get_method("fides+none")) is FidesRule  # the default gate: FIDES exactly as published
    assert get_method("standard+none").name == "standard"
    assert parse_method_names("standard,fides+agree,adacad+agree") == ["standard", "fides+agree", "adacad+agree"]
    dola = get_method("dola+agree")  # a rule without a no-context path gets it for the gate
    assert "no_context" in dola.paths and dola.lens_layers(8) == get_method("dola").lens_layers(8)
    assert get_method(get_method("cad"), gate=get_gate("nwcad", tau=0.1)).gate.tau == 0.1


@pytest.mark.parametrize(
    "spec, message",
    [
        ("fides+bogus", "unknown gate 'bogus' in method 'fides\\+bogus'; available gates: none, agree, nwcad"),
        ("standard+agree", "'standard' has nothing to gate"),
        ("fides+agree+nwcad", "more than one gate; a method takes at most one: rule\\+gate"),
        ("bogus+agree", "unknown method.* '?bogus.*; available methods: standard, .*optionally with \\+gate"),
    ],
)
def test_a_bad_gated_method_is_refused_naming_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message):
        get_method(spec)
    with pytest.raises(ValueError, match=message):
        parse_method_names(f"standard,{spec}")


@pytest.mark.parametrize(
    "gate, options, message",
    [
        ("nwcad", {"tau": 0.9}, "tau must be a number in \\[0, 0.693147\\]"),
        ("nwcad", {"kappa_prior": -0.1}, "kappa_prior must be a number in \\[0, 1\\]"),
        ("nwcad", {"kappa_context": float("nan")}, "kappa_context must be"),
        ("nwcad", {"top_k": 1}, "top_k must be an integer >= 2"),
        ("agree", {"prior_confidence": 1.5}, "prior_confidence must be a number in \\[0, 1\\]"),
        ("agree", {"commitment": True}, "commitment must be"),
        ("agree", {"nope": 1}, "bad options for gate 'agree'"),
    ],
)
def test_gate_thresholds_out_of_range_are_refused(gate, options, message):
    with pytest.raises(ValueError, match=message):
        get_gate(gate, **options)


def test_two_gates_by_name_and_by_argument_are_refused():
    with pytest.raises(ValueError, match="names its gate already"):
        get_method("fides+agree", gate="nwcad")
    with pytest.raises(ValueError, match="already has a gate"):
        get_method(get_method("fides+agree"), gate="nwcad")
