"""Classes registered by name (contrast rules, gates): one small registry shape for every such table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes of one kind by name, in registration order. `kind` names them in errors ("contrast rule", "gate")."""

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register `cls` under `name` (and set `cls.name`); another class under a taken name raises
        ValueError naming the one registered."""

        def decorate(cls: T) -> T:
            taken = self._classes.get(name)
            if taken is not None and taken is not cls:
                raise ValueError(f"a {self.kind} named {name!r} is already registered ({taken.__name__})")
            cls.name = name  # type: ignore[attr-defined]
            self._classes[name] = cls
            return cls

        return decorate

    def get(self, name: str) -> T:
        """The class registered as `name`; an unknown name raises ValueError naming the available ones."""
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; available {self.plural}: {', '.join(self.names())}"
            ) from None

    def find(self, name: str) -> T | None:
        """The class registered as `name`, or None."""
        return self._classes.get(name)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._classes)

    def unregister(self, name: str) -> None:
        """Forget `name` (a rule or gate defined for a while, e.g. in a test); an unknown name raises ValueError."""
        self.get(name)
        del self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes
