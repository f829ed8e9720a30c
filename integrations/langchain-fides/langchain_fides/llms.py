"""FidesLLM: a LangChain LLM that decodes with FIDES, taking the documents from the chain it runs in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.language_models import BaseLLM, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig

from fides_rag.calls import Answer, ChatPlan, documents_beside
from fides_rag.calls.options import plain_options
from fides_rag.prompts.template import document_texts
from langchain_fides._base import FidesParams
from langchain_fides._discovery import recorder
from langchain_fides.prompts import FidesPromptValue

_CALL_OPTIONS_VAR: ContextVar[dict[str, Any] | None] = ContextVar("fides_llm_call_options", default=None)
"""The call options of the generate/agenerate running in this context (part of the LLM cache key)."""


class FidesLLM(FidesParams, BaseLLM):  # type: ignore[misc]  # FidesParams' _generate/_stream serve both models (LangChain's names differ)
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

    def generate(
        self, prompts: list[str], stop: list[str] | None = None, callbacks: Any = None, **kwargs: Any
    ) -> LLMResult:
        token = _CALL_OPTIONS_VAR.set(plain_options(kwargs))
        try:
            return super().generate(prompts, stop, callbacks, **kwargs)
        finally:
            _CALL_OPTIONS_VAR.reset(token)

    async def agenerate(
        self, prompts: list[str], stop: list[str] | None = None, callbacks: Any = None, **kwargs: Any
    ) -> LLMResult:
        token = _CALL_OPTIONS_VAR.set(plain_options(kwargs))
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
            if documents_beside(prompt, texts):
                # The prompt is the question; the rendered prompt (with the documents) becomes the cache key.
                value = FidesPromptValue(question=prompt, documents=texts)
                return value.to_string(), {**kwargs, "documents": texts, "fides_question": prompt}
        return input, kwargs

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> str:
        input, kwargs = self._route(input, kwargs)
        return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> str:
        input, kwargs = self._route(input, kwargs)
        return await super().ainvoke(input, config, stop=stop, **kwargs)

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[str]:
        input, kwargs = self._route(input, kwargs)
        return super().stream(input, config, stop=stop, **kwargs)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        input, kwargs = self._route(input, kwargs)
        async for chunk in super().astream(input, config, stop=stop, **kwargs):
            yield chunk

    def batch(
        self, inputs: list[LanguageModelInput], config: Any = None, *, return_exceptions: bool = False, **kwargs: Any
    ) -> list[str]:
        # One invoke per input (in a thread pool): each item keeps its own run, hence its own retrieved
        # documents, and its own FidesPromptValue. BaseLLM.batch would hand _generate only the first
        # item's run manager and one shared kwargs dict. The decoder's lock serialises the decoding.
        return Runnable.batch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self, inputs: list[LanguageModelInput], config: Any = None, *, return_exceptions: bool = False, **kwargs: Any
    ) -> list[str]:
        return await Runnable.abatch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    # -- framework hooks ------------------------------------------------------------------------------

    def _plan(self, prompt: str, kwargs: dict[str, Any], parent_run_id: UUID | None, max_new: int) -> ChatPlan:
        texts = None if kwargs.get("documents") is None else document_texts(kwargs["documents"])
        found = [] if texts is not None else recorder.documents_for(parent_run_id, [prompt])
        return self._planner().conversation(
            [("user", prompt)],
            max_new,
            documents=texts,
            template_question=kwargs.get("fides_question"),
            template_first=True,
            found=found,
            system_as_context=False,
            retrieved=recorder.retrieved_for(parent_run_id),
            question=recorder.question_for(parent_run_id, prompt),
            where="the prompt",
        )

    def _prepared(self, prompt: str, stop: list[str] | None, parent_run_id: UUID | None, kwargs: dict[str, Any]) -> Any:
        opts = self._options(stop, kwargs)
        return self._call(self._plan(prompt, kwargs, parent_run_id, opts.max_new_tokens), opts)

    def _results(
        self, prompts: list[str], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]
    ) -> LLMResult:
        answers = [self._run(self._prepared(p, stop, parent, kwargs)) for p in prompts]
        return LLMResult(generations=[[Generation(text=a.text, generation_info=a.record)] for a in answers])

    def _stream_items(
        self, prompt: str, stop: list[str] | None, parent_run_id: UUID | None, kwargs: dict[str, Any]
    ) -> Iterator[GenerationChunk]:
        for item in self._prepared(prompt, stop, parent_run_id, kwargs).stream():  # text deltas, then the Answer
            if isinstance(item, Answer):
                yield GenerationChunk(text="", generation_info=self._answers.add(item).record)
            else:
                yield GenerationChunk(text=item)
