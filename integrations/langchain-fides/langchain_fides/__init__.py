"""LangChain integration of fides-rag: FIDES contrastive decoding as an LLM and a chat model.

Importing this package registers a callback hook that lets FIDES models find the documents a
chain retrieved before calling them (see langchain_fides._discovery).
"""

from langchain_fides._base import FidesFallbackError, UnansweredError
from langchain_fides._discovery import RetrievalRecorder, recorder
from langchain_fides.chat_models import ChatFides
from langchain_fides.llms import FidesLLM
from langchain_fides.prompts import FidesPromptValue, fides_rag_prompt

__all__ = [
    "ChatFides",
    "FidesFallbackError",
    "FidesLLM",
    "FidesPromptValue",
    "RetrievalRecorder",
    "UnansweredError",
    "fides_rag_prompt",
    "recorder",
]
