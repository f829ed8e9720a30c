"""FidesLLM: a LangChain LLM that decodes with FIDES, taking the documents from the chain it runs in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig

from fides_rag import GenerationResult
from fides_rag.generation.streaming import iterate_in_thread
from fides_rag.prompts import document_texts

from langchain_fides._base import FidesParams, Plan, cache_key_options
from langchain_fides._discovery import recorder
from langchain_fides.prompts import FidesPromptValue

_CALL_OPTIONS_VAR: ContextVar[dict[str, Any] | None] = ContextVar("fides_llm_call_options", default=None)
"""The call options of the generate/agenerate running in this context (part of the LLM cache key)."""


class FidesLLM(FidesParams, BaseLLM):
    """FIDES dual-path contrastive decoding as a LangChain LLM.

    Where the documents come from (first that applies):
    1. a FidesPromptValue (from `fides_rag_prompt()`) or `documents=` given to invoke/stream/batch/.bind
       while the prompt does not contain them: decoded with fides-rag's template (question + documents);
    2. `documents=` whose texts all occur in the prompt: context path = the prompt, no-context path =
       the prompt with those texts removed;
    3. documents retrieved earlier in the same chain run (found through callbacks) whose texts occur in
       the prompt: as in 2;
    4. none: plain 'standard' decoding of the prompt, with a logged warning and a note saying why (no
       documents given, an empty retrieval, or retrieved documents not found verbatim in the prompt);
       with `strict=True` a FidesFallbackError instead.

    LangChain's LLM cache keys on `_identifying_params`, which include the model, every decoding option
    and the options of the current call (`.bind(method=...)`, `invoke(..., documents=...)`).
    `last_result` holds the GenerationResult of the latest decoding.

    >>> llm = FidesLLM.from_model_id("gemma3-270m", max_new_tokens=32)
    >>> llm.invoke("In which city is the Eiffel Tower?", documents=["The Eiffel Tower is in Rome."])
    """

    @property
    def _llm_type(self) -> str:
        return "fides"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # BaseLLM builds its cache key (and the traced invocation params) from this alone; the options
        # of the call being generated (method, documents, ...) are added from a context variable.
        call = _CALL_OPTIONS_VAR.get()
        return {**self._fides_params(), **({"call_options": call} if call else {})}

    def generate(self, prompts: list[str], stop: list[str] | None = None, callbacks: Any = None, **kwargs: Any) -> LLMResult:
        token = _CALL_OPTIONS_VAR.set(cache_key_options(kwargs))
        try:
            return super().generate(prompts, stop, callbacks, **kwargs)
        finally:
            _CALL_OPTIONS_VAR.reset(token)

    async def agenerate(self, prompts: list[str], stop: list[str] | None = None, callbacks: Any = None, **kwargs: Any) -> LLMResult:
        token = _CALL_OPTIONS_VAR.set(cache_key_options(kwargs))
        try:
            return await super().agenerate(prompts, stop, callbacks, **kwargs)
        finally:
            _CALL_OPTIONS_VAR.reset(token)

    # -- public entry points: keep question and documents apart before BaseLLM flattens them ----------

    def _route(self, input: LanguageModelInput, kwargs: dict[str, Any]) -> tuple[LanguageModelInput, dict[str, Any]]:
        if isinstance(input, FidesPromptValue):
            return input.to_string(), {**kwargs, "documents": list(input.documents), "fides_question": input.question}
        if kwargs.get("documents") is not None and "fides_question" not in kwargs:
            prompt = self._convert_input(input).to_string()
            texts = document_texts(kwargs["documents"])
            if not (texts and all(t in prompt for t in texts)):
                # The prompt is the question; the rendered prompt (with the documents) becomes the cache key.
                value = FidesPromptValue(question=prompt, documents=texts)
                return value.to_string(), {**kwargs, "documents": texts, "fides_question": prompt}
        return input, kwargs

    def invoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> str:
        input, kwargs = self._route(input, kwargs)
        return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> str:
        input, kwargs = self._route(input, kwargs)
        return await super().ainvoke(input, config, stop=stop, **kwargs)

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> Iterator[str]:
        input, kwargs = self._route(input, kwargs)
        return super().stream(input, config, stop=stop, **kwargs)

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        input, kwargs = self._route(input, kwargs)
        async for chunk in super().astream(input, config, stop=stop, **kwargs):
            yield chunk

    def batch(self, inputs: list[LanguageModelInput], config: Any = None, *, return_exceptions: bool = False, **kwargs: Any) -> list[str]:
        # One invoke per input (in a thread pool): each item keeps its own run, hence its own retrieved
        # documents, and its own FidesPromptValue. BaseLLM.batch would hand _generate only the first
        # item's run manager and one shared kwargs dict. The decoder's lock serialises the decoding.
        return Runnable.batch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self, inputs: list[LanguageModelInput], config: Any = None, *, return_exceptions: bool = False, **kwargs: Any
    ) -> list[str]:
        return await Runnable.abatch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    # -- framework hooks ------------------------------------------------------------------------------

    def _plan(self, prompt: str, kwargs: dict[str, Any], parent_run_id: UUID | None, max_new: int) -> Plan:
        messages = [("user", prompt)]
        question = kwargs.get("fides_question")
        documents = kwargs.get("documents")
        if documents is not None:
            texts = document_texts(documents)
            if question is not None or not (texts and all(t in prompt for t in texts)):
                return Plan("template", "documents", question=question if question is not None else prompt, documents=texts)
            return self._prompt_plan(messages, texts, "documents", max_new, question=self._recorded_question(parent_run_id, prompt))
        found = recorder.documents_for(parent_run_id, [prompt])
        retrieved = recorder.retrieved_for(parent_run_id)
        if found:
            return self._retriever_plan(messages, found, retrieved, max_new, "the prompt", self._recorded_question(parent_run_id, prompt))
        return self._plain_plan(messages, _why_no_documents(retrieved, "the prompt"), self._recorded_question(parent_run_id, prompt))

    def _recorded_question(self, parent_run_id: UUID | None, prompt: str) -> str | None:
        """The run's question: the no-context path's under no_context_path='question', and tokenised as plain text."""
        return recorder.question_for(parent_run_id, prompt)

    def _generate_one(self, prompt: str, stop: list[str] | None, parent_run_id: UUID | None, kwargs: dict[str, Any]) -> Generation:
        opts = self._options(stop, kwargs)
        plan = self._plan(prompt, kwargs, parent_run_id, opts.max_new_tokens)
        result = self._decode(plan, opts)
        return Generation(text=result.text, generation_info=self._metadata(plan, opts, result))

    def _generate(
        self, prompts: list[str], stop: list[str] | None = None, run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> LLMResult:
        parent = run_manager.parent_run_id if run_manager else None
        return LLMResult(generations=[[self._generate_one(p, stop, parent, kwargs)] for p in prompts])

    async def _agenerate(
        self, prompts: list[str], stop: list[str] | None = None, run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> LLMResult:
        parent = run_manager.parent_run_id if run_manager else None
        generations = []
        for p in prompts:
            generations.append([await asyncio.to_thread(self._generate_one, p, stop, parent, kwargs)])
        return LLMResult(generations=generations)

    def _stream_items(self, prompt: str, stop: list[str] | None, parent_run_id: UUID | None, kwargs: dict[str, Any]) -> Iterator[GenerationChunk]:
        opts = self._options(stop, kwargs)
        plan = self._plan(prompt, kwargs, parent_run_id, opts.max_new_tokens)
        for item in self._decode_stream(plan, opts):
            if isinstance(item, GenerationResult):
                yield GenerationChunk(text="", generation_info=self._metadata(plan, opts, item))
            else:
                yield GenerationChunk(text=item)

    def _stream(
        self, prompt: str, stop: list[str] | None = None, run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> Iterator[GenerationChunk]:
        parent = run_manager.parent_run_id if run_manager else None
        for chunk in self._stream_items(prompt, stop, parent, kwargs):
            if run_manager and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self, prompt: str, stop: list[str] | None = None, run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> AsyncIterator[GenerationChunk]:
        parent = run_manager.parent_run_id if run_manager else None
        async for chunk in iterate_in_thread(lambda: self._stream_items(prompt, stop, parent, kwargs)):
            if run_manager and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk


def _why_no_documents(retrieved: list[Any] | None, where: str) -> str:
    """Why a call has no documents to contrast: what the run-tree recorder saw."""
    if retrieved is None:
        return "no documents were given (documents=) and no retriever ran in this chain run"
    if not retrieved:
        return "the retriever in this chain run returned no documents"
    return (
        f"{len(retrieved)} document(s) were retrieved in this chain run but none was found verbatim in {where} "
        f"(a formatter rewrote them, e.g. numbering or cleaning their text)"
    )
