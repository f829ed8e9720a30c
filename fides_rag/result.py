"""What a generation returns: the answer, and one record per generated token."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["eos", "stop", "length", "criteria", "cancelled"]
SIGNAL_NAMES = ("alpha", "opposition", "shift", "noise", "score")
"""FIDES's recorded values, readable as `StepRecord` attributes."""


@dataclass
class StepRecord:
    """One generated token and the per-token values its rule recorded (`StepOutput.records`), by name:
    FIDES records alpha, opposition, shift, noise and score; DVD beta and gamma; standard nothing."""

    token_id: int
    token: str
    values: dict[str, float] = field(default_factory=dict)
    logprob: float | None = None
    """The token's log-probability under the distribution it was chosen from (when the call asked for logprobs)."""
    top_logprobs: list[tuple[int, float]] | None = None
    """The most likely tokens of that distribution as (id, log-probability), most likely first (when asked)."""

    def __getattr__(self, name: str) -> float | None:
        # FIDES's signal names read as attributes (step.alpha, step.noise, ...); None where not recorded.
        if name in SIGNAL_NAMES:
            return self.__dict__.get("values", {}).get(name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """token_id, token and every recorded value as flat keys (and logprob, top_logprobs where recorded)."""
        data: dict[str, Any] = {"token_id": self.token_id, "token": self.token, **self.values}
        if self.logprob is not None:
            data["logprob"] = self.logprob
        if self.top_logprobs is not None:
            data["top_logprobs"] = [list(pair) for pair in self.top_logprobs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of `to_dict` (None values are dropped)."""
        values = {
            k: float(v)
            for k, v in data.items()
            if k not in ("token_id", "token", "logprob", "top_logprobs") and v is not None
        }
        top = data.get("top_logprobs")
        logprob = data.get("logprob")
        return cls(
            int(data["token_id"]),
            str(data["token"]),
            values,
            None if logprob is None else float(logprob),
            None if top is None else [(int(i), float(lp)) for i, lp in top],
        )


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
    closed_early: bool = False
    """A structured answer (JSON schema, regex, grammar) the token budget would have cut: the decoder forced the
    grammar's shortest completion in its last tokens, so the answer is complete and parses (`finish_reason` "eos", or
    "stop" where the budget ended it complete; never "length")."""

    @property
    def alphas(self) -> list[float | None]:
        return [s.alpha for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = [s.to_dict() for s in self.steps]
        return data

    def to_metadata(self) -> dict[str, Any]:
        """What a framework's response metadata carries (LangChain's response_metadata, LlamaIndex's
        additional_kwargs): the method, how it finished, the per-token alphas and records, notes, trimming,
        both prompts and token counts. The integrations add what only they know (requested method, sources)."""
        return {
            "method": self.method,
            "finish_reason": self.finish_reason,
            "closed_early": self.closed_early,
            "alphas": self.alphas,
            "steps": [s.to_dict() for s in self.steps],
            "notes": list(self.notes),
            "documents_trimmed": self.documents_trimmed,
            "document_tokens": self.document_tokens,
            "context_prompt": self.context_prompt,
            "no_context_prompt": self.no_context_prompt,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.token_ids),
        }
