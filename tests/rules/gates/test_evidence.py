"""The evidence gate against a float64 hand computation: the rule acts where the documents move the next token's
distribution (JSD at or above tau), the context path is taken as it is elsewhere; a config's calibrated tau reaches
the gate."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesConfig, available_gates, get_method
from fides_rag.decoder import FidesDecoder
from fides_rag.rules import StepInputs
from fides_rag.rules.gates import CONTEXT_AS_IS, RULE, EvidenceGate


def hand_jsd(a: list[float], b: list[float]) -> float:
    p = [math.exp(v) / sum(math.exp(u) for u in a) for v in a]
    q = [math.exp(v) / sum(math.exp(u) for u in b) for v in b]
    m = [(x + y) / 2 for x, y in zip(p, q)]
    return 0.5 * sum(x * math.log(x / z) for x, z in zip(p, m)) + 0.5 * sum(y * math.log(y / z) for y, z in zip(q, m))


# row 0: both paths alike (small JSD); row 1: the documents move the distribution far (large JSD).
CTX = [[2.0, 1.0, 0.0], [4.0, 0.0, 0.0]]
NO_CTX = [[2.1, 0.9, 0.0], [0.0, 4.0, 0.0]]


def step() -> StepInputs:
    return StepInputs.from_tensors(torch.tensor(CTX, dtype=torch.float64), torch.tensor(NO_CTX, dtype=torch.float64))


def test_the_statistic_is_the_jensen_shannon_divergence_of_the_two_paths():
    got = EvidenceGate().statistic(step()).tolist()
    assert got == pytest.approx([hand_jsd(CTX[0], NO_CTX[0]), hand_jsd(CTX[1], NO_CTX[1])], abs=1e-12)


def test_the_rule_acts_only_where_the_documents_move_the_distribution():
    small, large = (hand_jsd(c, n) for c, n in zip(CTX, NO_CTX))
    tau = (small + large) / 2
    decision = EvidenceGate(tau=tau).decide(step())
    assert decision.choice.tolist() == [CONTEXT_AS_IS, RULE]
    assert torch.equal(decision.logits, torch.tensor(CTX, dtype=torch.float64))
    assert EvidenceGate(tau=0.0).decide(step()).choice.tolist() == [RULE, RULE]
    assert EvidenceGate(tau=math.log(2)).decide(step()).choice.tolist() == [CONTEXT_AS_IS, CONTEXT_AS_IS]


@pytest.mark.parametrize("tau", [-0.1, 0.7, True, float("nan")])
def test_a_tau_outside_the_divergence_range_is_refused_naming_it(tau):
    with pytest.raises(ValueError, match=r"evidence: tau must be a number in \[0, 0.693147\]"):
        EvidenceGate(tau=tau)


def test_a_configs_calibrated_tau_reaches_the_gate_of_a_method_built_with_it():
    config = FidesConfig(gates={"evidence": {"tau": 0.25}})
    assert get_method("fides+evidence", config=config).gate.tau == 0.25
    assert get_method("fides", config=config, gate="evidence").gate.tau == 0.25
    assert get_method("fides+evidence").gate.tau == pytest.approx(math.log(2) / 2)
    assert "evidence" in available_gates()
    assert "gates" not in get_method("fides", config=config).options()  # FIDES itself is unchanged by them


def test_a_decoder_configured_with_a_calibrated_tau_gates_with_it(tokenizer, tiny_llama):
    config = FidesConfig(gates={"evidence": {"tau": 0.0}})
    decoder = FidesDecoder(tiny_llama, tokenizer, config=config)
    everywhere = decoder.generate("Q?", ["Doc."], method="fides+evidence", max_new_tokens=4)
    assert everywhere.method_options["gate_options"] == {"tau": 0.0}
    assert all(s.values["gate"] == RULE for s in everywhere.steps)
    fides = decoder.generate("Q?", ["Doc."], method="fides", max_new_tokens=4)
    assert everywhere.token_ids == fides.token_ids  # tau 0: the rule takes every token
    nowhere = decoder.generate(
        "Q?", ["Doc."], method=get_method("fides", gate=EvidenceGate(tau=math.log(2))), max_new_tokens=4
    )
    standard = decoder.generate("Q?", ["Doc."], method="standard", max_new_tokens=4)
    assert nowhere.token_ids == standard.token_ids
