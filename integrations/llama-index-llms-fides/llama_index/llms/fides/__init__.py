"""LlamaIndex LLM integration of fides-rag (FIDES dual-path contrastive decoding)."""

from llama_index.llms.fides.base import CALL_OPTIONS, GENERATION_OPTIONS, FidesLLM

__all__ = ["CALL_OPTIONS", "FidesLLM", "GENERATION_OPTIONS"]
