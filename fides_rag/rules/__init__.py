"""Contrast rules. Every module in this package that defines a `@register_method` rule is loaded here."""

import importlib
import pkgutil

from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.gated import GatedRule
from fides_rag.rules.gates import Gate, available_gates, get_gate, register_gate
from fides_rag.rules.registry import (
    accepts_option,
    available_methods,
    get_method,
    parse_method_names,
    register_method,
    split_method,
)

_BUILTIN_ORDER = ("standard", "cad", "adacad", "fides")
for _name in _BUILTIN_ORDER:
    importlib.import_module(f"{__name__}.{_name}")
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in {"base", "registry", "gated", "gates", *_BUILTIN_ORDER}:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ContrastRule",
    "Gate",
    "GatedRule",
    "StepInputs",
    "StepOutput",
    "accepts_option",
    "available_gates",
    "available_methods",
    "get_gate",
    "get_method",
    "parse_method_names",
    "register_gate",
    "register_method",
    "split_method",
]
