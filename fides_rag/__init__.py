"""fides-rag: faithful retrieval-augmented generation by dual-path contrastive decoding (FIDES)."""

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
