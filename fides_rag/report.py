"""Plain-text views of results for terminals and test logs."""

from __future__ import annotations

from fides_rag.result import GenerationResult


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def step_table(result: GenerationResult) -> str:
    """One line per generated token: the token and every value its rule recorded (alpha, signals, ...)."""
    names = list(dict.fromkeys(name for s in result.steps for name in s.values))
    lines = [" ".join([f"{'token':>16}", *(f"{name[:9]:>9}" for name in names)])]
    for s in result.steps:
        lines.append(" ".join([f"{s.token!r:>16}", *(f"{_fmt(s.values.get(name)):>9}" for name in names)]))
    return "\n".join(lines)
