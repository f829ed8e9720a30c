"""Contrast rules. Every module in this package that defines a `@register_method` rule is loaded here."""

import importlib
import pkgutil

from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import accepts_option, available_methods, get_method, parse_method_names, register_method

_BUILTIN_ORDER = ("standard", "cad", "adacad", "fides")
for _name in _BUILTIN_ORDER:
    importlib.import_module(f"{__name__}.{_name}")
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in {"base", "registry", *_BUILTIN_ORDER}:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ContrastRule", "StepInputs", "StepOutput", "accepts_option", "available_methods", "get_method", "parse_method_names", "register_method"]
