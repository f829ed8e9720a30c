"""Contrast rules registered by name, so a new baseline is one file in this package."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fides_rag.registry import Registry
from fides_rag.rules.base import ContrastRule

RuleType = TypeVar("RuleType", bound=type[ContrastRule])

RULES: Registry[type[ContrastRule]] = Registry("contrast rule")
"""Every contrast rule by name (`register_method` adds to it)."""


def register_method(name: str) -> Callable[[RuleType], RuleType]:
    """Class decorator: make a ContrastRule available as `get_method(name)` and `method=name`."""

    return RULES.register(name)  # type: ignore[return-value]


def available_methods() -> list[str]:
    """Names accepted by `method=`, in registration order (built-ins first)."""
    return RULES.names()


def is_registered(rule: ContrastRule) -> bool:
    """Whether `rule` is an instance of the class registered under its name, or a registered rule behind a registered
    gate (so its `options()` describe it)."""
    from fides_rag.rules.gated import GatedRule
    from fides_rag.rules.gates import gate_is_registered

    if type(rule) is GatedRule:
        return is_registered(rule.rule) and gate_is_registered(rule.gate)
    return RULES.find(rule.name) is type(rule)


def accepts_option(name: str, option: str) -> bool:
    """Whether the rule registered as `name` (or the rule of `rule+gate`) takes the constructor option `option`
    (e.g. FIDES's `config`)."""
    cls = RULES.find(name.split("+", 1)[0])
    return cls is not None and option in inspect.signature(cls.__init__).parameters


def split_method(method: str) -> tuple[str, str | None]:
    """ "fides+agree" -> ("fides", "agree"); "fides" -> ("fides", None). Raises ValueError naming what is accepted for
    an unknown rule or gate, an empty part, or more than one gate."""
    rule, plus, gate = method.partition("+")
    if "+" in gate:
        raise ValueError(
            f"method {method!r} names more than one gate; a method takes at most one: rule+gate, e.g. 'fides+agree'"
        )
    if rule not in RULES:
        raise ValueError(
            f"unknown method {rule!r}; available methods: {', '.join(available_methods())}"
            + (", each optionally with +gate" if plus else "")
        )
    if plus:
        from fides_rag.rules.gates import available_gates

        if gate not in available_gates():
            raise ValueError(
                f"unknown gate {gate!r} in method {method!r}; available gates: {', '.join(available_gates())}"
            )
    return rule, (gate if plus else None)


def get_method(method: str | ContrastRule, *, gate: Any = None, **options: Any) -> ContrastRule:
    """A configured rule: `get_method("cad", alpha=0.5)`; behind a gate `get_method("fides+agree")` or
    `get_method("cad", alpha=0.5, gate=NwcadGate(tau=0.2))` (options configure the rule). A rule object passes
    through unchanged (or gets `gate`). The gate `none` leaves the rule as it is. A gate given by name takes the
    options that the rule's config (FIDES's FidesConfig) holds for it in `gates` (`fides-rag calibrate --gate`)."""
    from fides_rag.rules.gated import GatedRule
    from fides_rag.rules.gates import get_gate

    if isinstance(method, ContrastRule):
        if options:
            raise ValueError("options can only be given with a method name, not with a configured rule object")
        rule = method
    elif not isinstance(method, str):
        raise TypeError(f"method must be a name or a ContrastRule, got {type(method).__name__}")
    else:
        name, named_gate = split_method(method)
        if named_gate is not None and gate is not None:
            raise ValueError(
                f"method {method!r} names its gate already; pass gate= with the bare rule name ({name!r}) instead"
            )
        gate = named_gate if named_gate is not None else gate
        try:
            rule = RULES.get(name)(**options)
        except TypeError as err:
            raise ValueError(f"bad options for method {name!r}: {err}") from None
    if gate is None:
        return rule
    if isinstance(gate, str):  # a gate by name takes the options the rule's config carries for it (calibrated)
        config = getattr(rule, "config", None)
        calibrated = config.gate_options(gate) if config is not None and hasattr(config, "gate_options") else {}
        gate = get_gate(gate, **calibrated)
    gate = get_gate(gate)
    return rule if type(gate).name == "none" else GatedRule(rule, gate)


def parse_method_names(spec: str | Sequence[str]) -> list[str]:
    """Method names from "standard,cad,fides+agree" or a list; "all" expands to every registered (ungated) method.

    Raises ValueError naming the unknown methods and the available ones."""
    names = [m.strip() for m in spec.split(",")] if isinstance(spec, str) else [str(m).strip() for m in spec]
    names = [m for m in names if m]
    if not names:
        raise ValueError(f"no method given; available methods: {', '.join(available_methods())} (or 'all')")
    expanded: list[str] = []
    for name in names:
        for method in available_methods() if name == "all" else [name]:
            if method not in expanded:
                expanded.append(method)
    unknown = [m for m in expanded if m.partition("+")[0] not in RULES]
    if unknown:
        raise ValueError(
            f"unknown method(s) {', '.join(unknown)}; available methods: {', '.join(available_methods())} "
            "(or 'all'), each optionally with +gate (e.g. fides+agree)"
        )
    for name in expanded:
        get_method(name)  # a bad gate, or a gate on a rule with nothing to gate
    return expanded
