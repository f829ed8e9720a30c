"""What a rule or gate keeps per sequence between steps: handed back to the same sequence whatever joins or leaves,
zeros at a sequence's first step; and a gate composed with a rule through the engine."""

from __future__ import annotations

import torch

from fides_rag import FidesDecoder, PromptTemplate, get_method, register_gate, register_method
from fides_rag.rules import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.gates import CONTEXT_AS_IS, RULE, Gate, GateDecision

QUESTIONS = ["What is the capital of France?", "Who chose Canberra?", "What jumps over the dog?"]
DOCUMENTS = [
    ["Lyon is the capital of France."],
    ["Canberra was chosen as a compromise."],
    ["The quick brown fox jumps."],
]


@register_method("test-counting")
class CountingRule(ContrastRule):
    """CAD that counts its own steps in its state and records the count."""

    state_size = 1

    def combine(self, step: StepInputs) -> StepOutput:
        count = step.state[:, 0]  # [B]
        logits = 2 * step.ctx_logits - step.no_ctx_logits
        return StepOutput(logits=logits, records={"count": count.clone()}, state=(count + 1).unsqueeze(-1))


@register_gate("test-always-context")
class AlwaysContext(Gate):
    def decide(self, step: StepInputs) -> GateDecision:
        logits = step.ctx_logits
        return GateDecision(torch.full((logits.shape[0],), CONTEXT_AS_IS, device=logits.device), logits)


@register_gate("test-never")
class Never(Gate):
    def decide(self, step: StepInputs) -> GateDecision:
        logits = step.ctx_logits
        return GateDecision(torch.full((logits.shape[0],), RULE, device=logits.device), logits)


def decoder_for(tiny_llama, tokenizer) -> FidesDecoder:
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))
    decoder.eos_token_ids = set()
    return decoder


def test_each_sequence_gets_its_own_state_back_in_a_batch_of_different_lengths(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    budgets = [3, 7, 5]
    results = [
        decoder.generate(q, d, method="test-counting", max_new_tokens=n)
        for q, d, n in zip(QUESTIONS, DOCUMENTS, budgets)
    ]
    for result, budget in zip(results, budgets):
        assert [s.values["count"] for s in result.steps] == list(range(budget))
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="test-counting", max_new_tokens=7)
    assert all([s.values["count"] for s in r.steps] == list(range(7)) for r in batch)


def test_a_gate_that_always_takes_the_context_decodes_as_standard(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    for question, documents in zip(QUESTIONS, DOCUMENTS):
        standard = decoder.generate(question, documents, method="standard", max_new_tokens=6)
        gated = decoder.generate(question, documents, method="fides+test-always-context", max_new_tokens=6)
        assert gated.token_ids == standard.token_ids and gated.method == "fides+test-always-context"
        assert [s.values["gate"] for s in gated.steps] == [CONTEXT_AS_IS] * 6


def test_a_gate_that_never_fires_decodes_as_its_rule_and_a_stateful_rule_keeps_its_state_behind_a_gate(
    tiny_llama, tokenizer
):
    decoder = decoder_for(tiny_llama, tokenizer)
    question, documents = QUESTIONS[0], DOCUMENTS[0]
    plain = decoder.generate(question, documents, method="fides", max_new_tokens=6)
    gated = decoder.generate(question, documents, method="fides+test-never", max_new_tokens=6)
    assert gated.token_ids == plain.token_ids and [s.alpha for s in gated.steps] == [s.alpha for s in plain.steps]
    counting = decoder.generate(question, documents, method="test-counting+agree", max_new_tokens=5)
    assert [s.values["count"] for s in counting.steps] == [0, 1, 2, 3, 4]


def test_gated_methods_decode_alike_alone_and_together(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    methods = ["fides+agree", "fides+nwcad", "adacad+agree", "cad+nwcad"]
    alone = {
        m: [decoder.generate(q, d, method=m, max_new_tokens=6).token_ids for q, d in zip(QUESTIONS, DOCUMENTS)]
        for m in methods
    }
    for method in methods:
        together = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=6)
        assert [r.token_ids for r in together] == alone[method]
    assert get_method("fides+agree").options()["gate_options"] == {"prior_confidence": 0.5, "commitment": 0.75}


def test_a_gate_on_the_decoders_own_rule_keeps_its_configuration(tiny_llama, tokenizer):
    from fides_rag import FidesConfig

    config = FidesConfig(lambda_=3.0)
    decoder = FidesDecoder(tiny_llama, tokenizer, method="fides", config=config)
    rule = decoder.rule_for("fides+agree")
    assert rule.name == "fides+agree" and rule.rule is decoder.rule_for("fides") and rule.rule.config.lambda_ == 3.0
    assert decoder.rule_for("cad+agree").rule.alpha == 1.0
