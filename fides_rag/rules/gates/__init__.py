"""Gates: per token, they leave the choice to a contrast rule or take one path as it is. One file each, registered
by name; a method names one after a `+` (`fides+agree`, `cad+nwcad`). The default, `none`, gates nothing."""

# The import order is the registration order: none, agree, nwcad, defer, blend, evidence.
# isort: off
from fides_rag.rules.gates.base import (
    CONTEXT_AS_IS,
    MEMORY_LEANING,
    NO_CONTEXT_AS_IS,
    RULE,
    Gate,
    GateDecision,
    available_gates,
    calibrated_gates,
    gate_is_registered,
    get_gate,
    register_gate,
)
from fides_rag.rules.gates.none import NoGate
from fides_rag.rules.gates.agree import AgreeGate
from fides_rag.rules.gates.nwcad import NwcadGate
from fides_rag.rules.gates.defer import DeferGate
from fides_rag.rules.gates.blend import BlendGate
from fides_rag.rules.gates.evidence import EvidenceGate
# isort: on

__all__ = [
    "CONTEXT_AS_IS",
    "MEMORY_LEANING",
    "NO_CONTEXT_AS_IS",
    "RULE",
    "AgreeGate",
    "BlendGate",
    "DeferGate",
    "EvidenceGate",
    "Gate",
    "GateDecision",
    "NoGate",
    "NwcadGate",
    "available_gates",
    "calibrated_gates",
    "gate_is_registered",
    "get_gate",
    "register_gate",
]
