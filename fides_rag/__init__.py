"""fides-rag: faithful retrieval-augmented generation by dual-path contrastive decoding (FIDES).

The public names load on first use (PEP 562), so that `import fides_rag.eval.metrics` or a script reading results
does not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fides_rag.decoder import (
        AsyncTextStream,
        FidesDecoder,
        ForwardTimer,
        GenerationSettings,
        PromptPair,
        TextStream,
    )
    from fides_rag.errors import (
        BudgetBelowShortestAnswer,
        CallInputError,
        ContextWindowExceeded,
        DecoderInputError,
        EmptyQuestion,
        FetchError,
        FidesFallbackError,
        GrammarLimitExceeded,
        GrammarViolation,
        IncompleteAnswerError,
        KVPoolExceeded,
        MissingExtraError,
        NonFiniteLogitsError,
        QueueFullError,
        UnansweredError,
        UnsupportedArchitectureError,
    )
    from fides_rag.generation.options import GenerationOptions, MethodOptions
    from fides_rag.method.config import FidesConfig
    from fides_rag.models.loading import load_model, select_device
    from fides_rag.prompts.template import Demonstration, PromptTemplate
    from fides_rag.result import GenerationResult, StepRecord
    from fides_rag.rules import (
        ContrastRule,
        Gate,
        GatedRule,
        available_gates,
        available_methods,
        get_gate,
        get_method,
        register_gate,
        register_method,
    )

__version__ = "0.2.0"

_MODULE_OF: dict[str, str] = {
    "AsyncTextStream": "fides_rag.decoder",
    "BudgetBelowShortestAnswer": "fides_rag.errors",
    "CallInputError": "fides_rag.errors",
    "ContextWindowExceeded": "fides_rag.errors",
    "ContrastRule": "fides_rag.rules",
    "DecoderInputError": "fides_rag.errors",
    "Demonstration": "fides_rag.prompts.template",
    "EmptyQuestion": "fides_rag.errors",
    "FetchError": "fides_rag.errors",
    "FidesConfig": "fides_rag.method.config",
    "FidesDecoder": "fides_rag.decoder",
    "FidesFallbackError": "fides_rag.errors",
    "ForwardTimer": "fides_rag.decoder",
    "Gate": "fides_rag.rules",
    "GatedRule": "fides_rag.rules",
    "GenerationOptions": "fides_rag.generation.options",
    "GenerationResult": "fides_rag.result",
    "GenerationSettings": "fides_rag.decoder",
    "GrammarLimitExceeded": "fides_rag.errors",
    "GrammarViolation": "fides_rag.errors",
    "IncompleteAnswerError": "fides_rag.errors",
    "KVPoolExceeded": "fides_rag.errors",
    "MethodOptions": "fides_rag.generation.options",
    "MissingExtraError": "fides_rag.errors",
    "NonFiniteLogitsError": "fides_rag.errors",
    "PromptPair": "fides_rag.decoder",
    "PromptTemplate": "fides_rag.prompts.template",
    "QueueFullError": "fides_rag.errors",
    "StepRecord": "fides_rag.result",
    "TextStream": "fides_rag.decoder",
    "UnansweredError": "fides_rag.errors",
    "UnsupportedArchitectureError": "fides_rag.errors",
    "available_gates": "fides_rag.rules",
    "available_methods": "fides_rag.rules",
    "get_gate": "fides_rag.rules",
    "get_method": "fides_rag.rules",
    "load_model": "fides_rag.models.loading",
    "register_gate": "fides_rag.rules",
    "register_method": "fides_rag.rules",
    "select_device": "fides_rag.models.loading",
}
"""Each public name -> the module that defines it."""

__all__ = [
    "AsyncTextStream",
    "BudgetBelowShortestAnswer",
    "CallInputError",
    "ContextWindowExceeded",
    "ContrastRule",
    "DecoderInputError",
    "Demonstration",
    "EmptyQuestion",
    "FetchError",
    "FidesConfig",
    "FidesDecoder",
    "FidesFallbackError",
    "ForwardTimer",
    "Gate",
    "GatedRule",
    "GenerationOptions",
    "GenerationResult",
    "GenerationSettings",
    "GrammarLimitExceeded",
    "GrammarViolation",
    "IncompleteAnswerError",
    "KVPoolExceeded",
    "MethodOptions",
    "MissingExtraError",
    "NonFiniteLogitsError",
    "PromptPair",
    "PromptTemplate",
    "QueueFullError",
    "StepRecord",
    "TextStream",
    "UnansweredError",
    "UnsupportedArchitectureError",
    "available_gates",
    "available_methods",
    "get_gate",
    "get_method",
    "load_model",
    "register_gate",
    "register_method",
    "select_device",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
