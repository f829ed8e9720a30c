"""LlamaIndex LLM integration of fides-rag (FIDES dual-path contrastive decoding)."""

from llama_index.llms.fides.base import FidesLLM
from llama_index.llms.fides.options import CALL_OPTIONS, GENERATION_OPTIONS, FidesFallbackError, UnansweredError
from llama_index.llms.fides.prompts import fides_rag_qa_template

__all__ = [
    "CALL_OPTIONS",
    "FidesFallbackError",
    "FidesLLM",
    "GENERATION_OPTIONS",
    "UnansweredError",
    "fides_rag_qa_template",
]
