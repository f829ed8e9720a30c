"""FidesLLM's structured output (a mixin): `structured_predict`, its async and streaming forms, and so
`as_structured_llm`, decode under a grammar that holds the answer to the output class's JSON schema, so even a small
model returns a valid object.

A prompt whose context variables (context_str/context_msg) are filled is paired as `predict` pairs it; any other
prompt is formatted into messages and paired as `chat` pairs them (documents= in llm_kwargs, tool messages, a context
system message). With `pydantic_program_mode` other than DEFAULT, LlamaIndex's own programs run instead (FUNCTION:
a call of the class as a tool, forced by grammar too), and their prompt's context variables are the context path as
in any program's call (`programs.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatResponse, CompletionResponse
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import LLMStructuredPredictEndEvent, LLMStructuredPredictStartEvent
from llama_index.core.program.utils import process_streaming_objects
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.fides.context import find_context
from llama_index.llms.fides.options import CALL_OPTIONS

from fides_rag.calls import iterate_in_thread, parse_structure, with_structure
from fides_rag.calls.options import split_template_args

dispatcher = get_dispatcher(__name__)


class StructuredPrediction:
    """Grammar-constrained structured_predict and friends (reads the LLM's fields and pairing methods)."""

    if TYPE_CHECKING:  # what FidesLLM and its LlamaIndex base give this mixin
        context_variables: Any
        context_separator: Any
        pydantic_program_mode: Any
        _template_pair: Any
        _options: Any
        complete: Any
        stream_complete: Any
        chat: Any
        stream_chat: Any

    def _structured_calls(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> tuple[
        Callable[[], CompletionResponse | ChatResponse], Callable[[], Iterator[CompletionResponse | ChatResponse]]
    ]:
        """(one call, its streaming form) under the output class's schema."""
        template_args, call = split_template_args(prompt_args, prompt.template_vars, CALL_OPTIONS)
        if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
            raise TypeError(f"output_cls must be a pydantic BaseModel class, got {output_cls!r}")
        call = with_structure({**call, **(llm_kwargs or {})}, output_cls, "structured_predict")
        if find_context(prompt, template_args, self.context_variables, self, self.context_separator):
            if "documents" in call:
                raise TypeError("the prompt's context variables hold the context; drop documents=")
            plan = self._template_pair(prompt, template_args, self._options(dict(call)).max_new_tokens)
            return (
                lambda: self.complete(plan.context_prompt or "", formatted=True, _plan=plan, **call),
                lambda: self.stream_complete(plan.context_prompt or "", formatted=True, _plan=plan, **call),
            )
        messages = prompt.format_messages(llm=self, **template_args)  # type: ignore[arg-type]  # self is a FidesLLM
        return lambda: self.chat(messages, **call), lambda: self.stream_chat(messages, **call)

    @staticmethod
    def _text_and_info(response: CompletionResponse | ChatResponse) -> tuple[str, dict[str, Any]]:
        text = response.message.content if isinstance(response, ChatResponse) else response.text
        return text or "", response.additional_kwargs

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """An `output_cls` object, decoded under its JSON schema (llm_kwargs: per-call options, documents=)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            base: Any = super()  # FidesLLM's LlamaIndex LLM, which a mixin cannot name
            return base.structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        one, _ = self._structured_calls(output_cls, prompt, llm_kwargs, prompt_args)
        text, info = self._text_and_info(one())
        result = parse_structure(text, info.get("finish_reason"), output_cls)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            base: Any = super()  # FidesLLM's LlamaIndex LLM, which a mixin cannot name
            return await base.astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        return await asyncio.to_thread(self.structured_predict, output_cls, prompt, llm_kwargs, **prompt_args)

    def _structured_stream_call(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Any, None, None]:
        """Partial objects as the answer grows (LlamaIndex's flexible models), the validated object last."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            base: Any = super()  # FidesLLM's LlamaIndex LLM, which a mixin cannot name
            return base._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        _, stream = self._structured_calls(output_cls, prompt, llm_kwargs, prompt_args)

        def gen() -> Generator[Any, None, None]:
            text, current = "", None
            info: dict[str, Any] = {}
            for response in stream():
                text, info = self._text_and_info(response)
                if response.raw is None and text:
                    current = process_streaming_objects(  # type: ignore[type-var,assignment]  # one object at a time, never a list
                        CompletionResponse(text=text), output_cls, cur_objects=None if current is None else [current]
                    )
                    yield current
            yield parse_structure(text, info.get("finish_reason"), output_cls)

        return gen()

    async def _structured_astream_call(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Any, None]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            base: Any = super()  # FidesLLM's LlamaIndex LLM, which a mixin cannot name
            return await base._structured_astream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        return iterate_in_thread(lambda: self._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args))
