"""Every error a caller of fides-rag may catch, in one place (also importable from `fides_rag`). A leaf module: it
imports nothing of fides_rag, so every layer (the engine's rooms too) may raise these.

Bad input is a ValueError (TypeError too for `DecoderInputError`) whose `field`, where it has one, names what to fix."""

from __future__ import annotations

from typing import Any

__all__ = [
    "BudgetBelowShortestAnswer",
    "CallInputError",
    "ContextWindowExceeded",
    "DecoderInputError",
    "EmptyQuestion",
    "FetchError",
    "FidesFallbackError",
    "GrammarLimitExceeded",
    "GrammarViolation",
    "IncompleteAnswerError",
    "KVPoolExceeded",
    "MissingExtraError",
    "NonFiniteLogitsError",
    "QueueFullError",
    "UnansweredError",
    "UnsupportedArchitectureError",
]


class KVPoolExceeded(ValueError):
    """A request needs more blocks of the KV pool than the whole pool holds: it could never be admitted."""

    field = "max_tokens"


class ContextWindowExceeded(ValueError):
    """A prompt that, with max_new_tokens, does not fit the model's context window (bad input, refused before
    anything decodes). `field`: what to shorten; `tokens`, `max_new_tokens`, `context_window`: the numbers."""

    field = "prompt"

    def __init__(
        self,
        tokens: int,
        max_new_tokens: int,
        context_window: int,
        what: str = "the prompt",
        message: str | None = None,
    ) -> None:
        super().__init__(
            message
            or f"a prompt of {tokens} tokens plus max_new_tokens={max_new_tokens} exceeds the context window of "
            f"{context_window}; shorten {what} or lower max_new_tokens"
        )
        self.tokens, self.max_new_tokens, self.context_window = tokens, max_new_tokens, context_window


class EmptyQuestion(ValueError):
    """A question that is not a non-empty string (bad input). `field`: what to fix."""

    field = "question"


class GrammarViolation(ValueError):
    """A token the grammar refuses was accepted, or the grammar reached a state no token can continue."""


class GrammarLimitExceeded(ValueError):
    """A grammar past a limit of the grammar library (llguidance's parser or lexer), found by the search from its
    start before anything decodes: every answer would run into it. `field`: the grammar's keyword (json_schema, ...)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(
            f"the {kind.replace('_', ' ')} is past a limit of the grammar library: {reason}; simplify it (fewer "
            f"optional "
            "properties in one object, shorter repetitions, less nesting)"
        )
        self.field, self.reason = kind, reason


class BudgetBelowShortestAnswer(ValueError):
    """A request's max_new_tokens is fewer than the tokens its grammar's shortest complete answer needs: the answer
    could only be cut, so the request is refused before anything decodes. `needed`: that shortest answer's tokens."""

    field = "max_new_tokens"

    def __init__(self, kind: str, budget: int, needed: int) -> None:
        super().__init__(
            f"max_new_tokens={budget} is fewer than the {needed} tokens the shortest complete answer of the "
            f"{kind.replace('_', ' ')} needs, so the answer could only be cut: raise max_new_tokens to at least "
            f"{needed}"
        )
        self.kind, self.budget, self.needed = kind, budget, needed


class NonFiniteLogitsError(ValueError):
    """The model or a rule produced NaN or inf values; decoding cannot continue meaningfully."""


class QueueFullError(RuntimeError):
    """The engine's queue holds `max_queue` waiting requests already; try again later."""


class UnsupportedArchitectureError(ValueError):
    """The model's family has no verified logit lens, so FIDES's Noise signal cannot be trusted on it."""


class FetchError(RuntimeError):
    """A fetch that cannot complete: the message names the part or package and what to do."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


class CallInputError(ValueError):
    """Bad input to a call; `field` names what to fix (the server answers it with a 400 naming that field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class FidesFallbackError(ValueError):
    """Raised with `strict=True` where a call would otherwise fall back (to `standard`, or to guessing the context)."""


class IncompleteAnswerError(ValueError):
    """A structured answer (or a forced call) stopped at max_new_tokens before it was complete."""


class UnansweredError(ValueError):
    """An agent's turn answered nothing, after a second decoding under the answer rules; `cause` says why and
    `answer` is the last Answer (its record holds the notes)."""

    def __init__(self, cause: str, answer: Any = None) -> None:
        super().__init__(
            f"the model answered nothing: {cause}. It was decoded a second time with the end of turn and "
            "markup barred from its first token, and answered nothing again; raise max_new_tokens, give "
            "the answering turn clearer evidence, or use a larger model"
        )
        self.cause, self.answer = cause, answer


class DecoderInputError(TypeError, ValueError):
    """What a front door was given cannot make a decoder (a TypeError, and a ValueError so that a pydantic validator
    reports it as a validation error)."""
