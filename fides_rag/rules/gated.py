"""A contrast rule behind a gate (`fides+agree`, `cad+nwcad`): the gate decides per token whether the rule acts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fides_rag.rules.base import NO_CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.gates.base import RULE, Gate


class GatedRule(ContrastRule):
    """`rule`'s logits where `gate` leaves the token to it, the gate's elsewhere. Every step records `gate`: 0 where
    the rule chose, else what the gate took (1 the context path as is, 2 the no-context path as is, 3 a blend
    leaning to memory). The rule's own records are kept as the rule computed them.

    Build it with `get_method("fides+agree")` or `get_method("fides", gate="agree")`."""

    def __init__(self, rule: ContrastRule, gate: Gate) -> None:
        if not rule.contrasts:
            raise ValueError(_nothing_to_gate(rule, gate))
        if isinstance(rule, GatedRule):
            raise ValueError(f"method {rule.name!r} already has a gate; a method takes at most one: rule+gate")
        self.rule, self.gate = rule, gate

    @property
    def name(self) -> str:  # type: ignore[override]  # derived from the rule and the gate
        return f"{self.rule.name}+{self.gate.name}"

    @property
    def paths(self) -> tuple[str, ...]:  # type: ignore[override]  # derived from the rule and the gate
        """The rule's paths, and the no-context path the gate reads."""
        return self.rule.paths if NO_CONTEXT in self.rule.paths else (*self.rule.paths, NO_CONTEXT)

    @property
    def state_size(self) -> int:  # type: ignore[override]  # derived from the rule and the gate
        return self.rule.state_size + self.gate.state_size

    @property
    def reads_end_tokens(self) -> bool:  # type: ignore[override]  # derived from the rule
        return self.rule.reads_end_tokens

    @property
    def layer_state_paths(self) -> tuple[str, ...]:
        return self.rule.layer_state_paths

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        return self.rule.lens_layers(num_layers)

    def masked_heads(self, model: Any, tokenizer: Any) -> dict[int, tuple[int, ...]] | None:
        return self.rule.masked_heads(model, tokenizer)

    def combine(self, step: StepInputs) -> StepOutput:
        own = self.rule.state_size
        rule_state = gate_state = None
        if step.state is not None:
            rule_state, gate_state = step.state[:, :own], step.state[:, own:]  # [B, own], [B, gate's]
        decided = self.rule.combine(replace(step, state=rule_state if own else None))
        gated = self.gate.decide(replace(step, state=gate_state if self.gate.state_size else None))
        logits = torch.where((gated.choice == RULE)[:, None], decided.logits, gated.logits)  # [B, V]
        records = {**decided.records, "gate": gated.choice.to(logits.dtype)}
        states = [
            s for s in (decided.state if own else None, gated.state if self.gate.state_size else None) if s is not None
        ]
        return StepOutput(logits=logits, records=records, state=torch.cat(states, dim=-1) if states else None)

    def options(self) -> dict:
        return {
            "rule": self.rule.name,
            "rule_options": self.rule.options(),
            "gate": self.gate.name,
            "gate_options": self.gate.options(),
        }


def _nothing_to_gate(rule: ContrastRule, gate: Gate) -> str:
    return (
        f"method {rule.name!r} has nothing to gate: it decodes the context path alone, with no contrast; put the "
        f"gate {gate.name!r} on a contrast rule, e.g. 'fides+{gate.name}' or 'cad+{gate.name}'"
    )
