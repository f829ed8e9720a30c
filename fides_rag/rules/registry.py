"""Contrast rules registered by name, so a new baseline is one file in this package."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence, TypeVar

from fides_rag.rules.base import ContrastRule

RuleType = TypeVar("RuleType", bound=type[ContrastRule])

_REGISTRY: dict[str, type[ContrastRule]] = {}


def register_method(name: str) -> Callable[[RuleType], RuleType]:
    """Class decorator: make a ContrastRule available as `get_method(name)` and `method=name`."""

    def decorate(cls: RuleType) -> RuleType:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"a contrast rule named {name!r} is already registered ({_REGISTRY[name].__name__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available_methods() -> list[str]:
    """Names accepted by `method=`, in registration order (built-ins first)."""
    return list(_REGISTRY)


def is_registered(rule: ContrastRule) -> bool:
    """Whether `rule` is an instance of the class registered under its name (so its `options()` describe it)."""
    return _REGISTRY.get(rule.name) is type(rule)


def accepts_option(name: str, option: str) -> bool:
    """Whether the rule registered as `name` takes the constructor option `option` (e.g. FIDES's `config`)."""
    cls = _REGISTRY.get(name)
    return cls is not None and option in inspect.signature(cls.__init__).parameters


def get_method(method: str | ContrastRule, **options: Any) -> ContrastRule:
    """A configured rule: `get_method("cad", alpha=0.5)`. A rule object passes through unchanged."""
    if isinstance(method, ContrastRule):
        if options:
            raise ValueError("options can only be given with a method name, not with a configured rule object")
        return method
    if not isinstance(method, str):
        raise TypeError(f"method must be a name or a ContrastRule, got {type(method).__name__}")
    try:
        cls = _REGISTRY[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; available methods: {', '.join(available_methods())}") from None
    try:
        return cls(**options)
    except TypeError as err:
        raise ValueError(f"bad options for method {method!r}: {err}") from None


def parse_method_names(spec: str | Sequence[str]) -> list[str]:
    """Method names from "standard,cad" or a list; "all" expands to every registered method, in order.

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
    unknown = [m for m in expanded if m not in _REGISTRY]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; available methods: {', '.join(available_methods())} (or 'all')")
    return expanded
