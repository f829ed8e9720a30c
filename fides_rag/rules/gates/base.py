"""The contract of a gate: per token, it either leaves the choice to the contrast rule or takes one path's logits
as they are. A gate reads the context and no-context paths only; the rule it guards is unchanged."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from fides_rag.registry import Registry
from fides_rag.rules.base import StepInputs

RULE, CONTEXT_AS_IS, NO_CONTEXT_AS_IS, MEMORY_LEANING = 0, 1, 2, 3
"""What chose a token, as recorded in each step's `gate` value: the contrast rule; the gate, with the context path's
logits unchanged; the gate, with the no-context path's logits unchanged; the gate, with its own blend leaning to
the no-context path (GRD's prior-trusted tokens)."""


@dataclass
class GateDecision:
    """One step's choice per row, and what the gate wants recorded."""

    choice: torch.Tensor
    """[B] long: RULE, or what the gate took instead (CONTEXT_AS_IS, NO_CONTEXT_AS_IS, MEMORY_LEANING)."""
    logits: torch.Tensor
    """[B, V] the gate's logits, used on the rows whose choice is not RULE."""
    state: torch.Tensor | None = None
    """[B, state_size] each row's state after this step (gates with `state_size` > 0)."""


class Gate(ABC):
    """Decides, token by token, where a contrast rule may act. Subclasses register with `@register_gate`."""

    name: ClassVar[str] = ""
    state_size: ClassVar[int] = 0
    """Values a gate keeps per sequence between steps (`StepInputs.state`; zeros at a sequence's first step)."""
    threshold: ClassVar[str | None] = None
    """The option `fides-rag calibrate --gate` fits, where the gate leaves a token to the rule on one side of a
    threshold on one per-token `statistic` (None: the gate has no such option)."""
    rule_above: ClassVar[bool] = True
    """Whether the rule acts where `statistic` >= the threshold (True) or where it is below (False)."""

    @abstractmethod
    def decide(self, step: StepInputs) -> GateDecision:
        """Each row's choice from the two paths' logits. Runs on the device: no host synchronisation."""

    def statistic(self, step: StepInputs) -> torch.Tensor:
        """[B] the per-token value the gate compares with its `threshold` option (gates that declare one)."""
        raise NotImplementedError(f"the gate {self.name!r} has no threshold to calibrate")

    def options(self) -> dict[str, Any]:
        """The gate's settings, recorded with every result; equal options must gate alike."""
        return {}

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({settings})"


GateType = TypeVar("GateType", bound=type[Gate])
GATES: Registry[type[Gate]] = Registry("gate")
"""Every gate by name (`register_gate` adds to it)."""


def register_gate(name: str) -> Callable[[GateType], GateType]:
    """Class decorator: make a Gate available as `get_gate(name)` and as the `+name` of a method."""

    return GATES.register(name)  # type: ignore[return-value]


def available_gates() -> list[str]:
    """Names a method accepts after its `+` (e.g. `fides+agree`), in registration order."""
    return GATES.names()


def calibrated_gates() -> list[str]:
    """Names of the gates with a threshold `fides-rag calibrate --gate` can fit."""
    return [name for name in GATES.names() if GATES.get(name).threshold is not None]


def gate_is_registered(gate: Gate) -> bool:
    return GATES.find(gate.name) is type(gate)


def get_gate(gate: str | Gate, **options: Any) -> Gate:
    """A configured gate: `get_gate("nwcad", tau=0.05)`. A gate object passes through unchanged."""
    if isinstance(gate, Gate):
        if options:
            raise ValueError("options can only be given with a gate name, not with a configured gate object")
        return gate
    if not isinstance(gate, str):
        raise TypeError(f"gate must be a name or a Gate, got {type(gate).__name__}")
    cls = GATES.get(gate)
    try:
        return cls(**options)
    except TypeError as err:
        raise ValueError(f"bad options for gate {gate!r}: {err}") from None


def checked_fraction(gate: str, option: str, value: Any, *, low: float = 0.0, high: float = 1.0) -> float:
    """`value` as a float in [low, high], or a ValueError naming the gate, the option and the range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ValueError(f"{gate}: {option} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)
