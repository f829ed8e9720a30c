"""Deprecated module name: the conversation planner lives in `fides_rag.calls.planning` (and `AnswerStream` in
`fides_rag.calls.answering`); these names remain importable from here."""

from fides_rag.calls.answering import AnswerStream
from fides_rag.calls.planning import DOCUMENTS_INSTRUCTION, ChatPlan, ChatPrompts, Turn

__all__ = ["DOCUMENTS_INSTRUCTION", "AnswerStream", "ChatPlan", "ChatPrompts", "Turn"]
