"""Plain-text views of results for terminals and test logs."""

from __future__ import annotations

from fides_rag.result import GenerationResult


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def step_table(result: GenerationResult) -> str:
    """One line per generated token: the token and its alpha, signals and fused score."""
    lines = [f"{'token':>16} {'alpha':>7} {'opp':>7} {'shift':>7} {'noise':>7} {'score':>7}"]
    for s in result.steps:
        lines.append(
            f"{s.token!r:>16} {_fmt(s.alpha):>7} {_fmt(s.opposition):>7} {_fmt(s.shift):>7} {_fmt(s.noise):>7} {_fmt(s.score):>7}"
        )
    return "\n".join(lines)
