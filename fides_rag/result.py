"""What a generation returns: the answer, and one record per generated token."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["eos", "stop", "length", "criteria"]


@dataclass
class StepRecord:
    """One generated token and the quantities that decided it. Fields a method does not compute are None."""

    token_id: int
    token: str
    alpha: float | None = None
    opposition: float | None = None
    shift: float | None = None
    noise: float | None = None
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenerationResult:
    """The outcome of one generation."""

    text: str
    """The answer: special tokens and the first stop string (and everything after it) removed, whitespace stripped."""
    token_ids: list[int]
    """Every generated id, including a final EOS token if one ended the answer."""
    steps: list[StepRecord]
    method: str
    """The method that decoded this answer (after any fallback, see `notes`)."""
    requested_method: str
    method_options: dict[str, Any]
    finish_reason: FinishReason
    context_prompt: str
    no_context_prompt: str | None
    """None when the method ran a single path."""
    prompt_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    """Why the decoding differed from what was asked, e.g. no documents or trimmed documents."""
    documents_trimmed: bool = False
    document_tokens: tuple[int, int] | None = None
    """(tokens given, tokens kept) of the document block when it had to be trimmed to fit the context window."""

    @property
    def alphas(self) -> list[float | None]:
        return [s.alpha for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = [s.to_dict() for s in self.steps]
        return data
