"""FidesLLM: a LlamaIndex LLM that decodes with FIDES, using the retrieved nodes as the context path.

The LlamaIndex hooks live here; the options in `options.py`, the two prompts of a call in `pairing.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.chat_engine.condense_plus_context import DEFAULT_CONTEXT_PROMPT_TEMPLATE
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import LLMPredictEndEvent, LLMPredictStartEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import astream_completion_response_to_tokens, stream_completion_response_to_tokens
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen
from llama_index.llms.fides.context import CONTEXT_VARIABLES
from llama_index.llms.fides.decoding import PairDecoding
from llama_index.llms.fides.function_calling import FunctionCalling
from llama_index.llms.fides.options import CALL_OPTIONS, GENERATION_OPTIONS, FidesFallbackError
from llama_index.llms.fides.pairing import CallPairing
from llama_index.llms.fides.programs import program_call, watch_programs
from llama_index.llms.fides.structured import StructuredPrediction

from fides_rag import FidesConfig, FidesDecoder, GenerationResult
from fides_rag.calls import (
    AnswerLog,
    CallFactory,
    CallOptions,
    ChatPlan,
    DecodingFields,
    ToolCalling,
    fold_fides_constants,
    iterate_in_thread,
)
from fides_rag.calls.decoders import decoder_for
from fides_rag.calls.options import split_template_args

dispatcher = get_dispatcher(__name__)
logger = logging.getLogger("llama_index.llms.fides")
__all__ = ["CALL_OPTIONS", "GENERATION_OPTIONS", "FidesFallbackError", "FidesLLM"]


class FidesLLM(PairDecoding, CallPairing, FunctionCalling, StructuredPrediction, DecodingFields, FunctionCallingLLM):
    """A LlamaIndex LLM that answers from the retrieved context with FIDES dual-path contrastive decoding.

    In query and chat engines the retrieved text (``context_str`` / ``context_msg``) forms the context
    path; the same prompt with that text emptied forms the no-context path. Plain ``complete``/``chat``
    calls decode normally unless given ``documents=[...]``.

    It is a FunctionCallingLLM: tools (``chat_with_tools``, ``FunctionAgent``) enter both paths identically, tool
    messages are the evidence (``documents_source: "tool_messages"``), tool_required or a named tool_choice forces a
    valid call by grammar, and ``structured_predict``/``as_structured_llm`` answers are held to the output class's
    JSON schema.

    Its decoding fields (method, fides_config, max_new_tokens, stop, sampling, strict, no_context_path, batching) are
    every front door's (`fides_rag.calls.DecodingFields`); FIDES constants may also be given by name (weights=,
    lambda_=, ...) at construction, folded onto the decoder's. With no_context_path='emptied' the no-context path is
    the prompt with context_str/context_msg emptied.

    >>> llm = FidesLLM.from_model_id("smollm2-135m-instruct", method="fides", max_new_tokens=64)
    >>> index.as_query_engine(llm=llm).query("In which city is the Eiffel Tower located?")
    >>> llm.last_result.alphas   # per-token contrast strengths of the last generation
    """

    model_name: str = Field(default="fides", description="Name of the backbone, reported in metadata.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (only with do_sample=True).")
    use_chat_template: bool | None = Field(
        default=None,
        description="Render prompts with the tokenizer's chat template (None: when it has one and no "
        "messages_to_prompt "
        "was given). It also makes is_chat_model true, so LlamaIndex picks its chat prompts.",
    )
    context_variables: list[str] = Field(
        default_factory=lambda: list(CONTEXT_VARIABLES),
        description="Template variables that hold retrieved text: emptied in the no-context path.",
    )
    context_separator: str = Field(
        default="\n\n", description="Joins documents (or simple_summarize's list of chunks) into one context."
    )
    chat_context_templates: list[str] = Field(
        default_factory=lambda: [DEFAULT_CONTEXT_TEMPLATE, DEFAULT_CONTEXT_PROMPT_TEMPLATE],
        description="System-message templates whose {context_str} is taken as the context when chat() gets "
        "already-rendered messages; the first also wraps chat(documents=...).",
    )
    history_size: int = Field(default=16, ge=0, description="How many recent generations `history` keeps.")

    _decoder: FidesDecoder = PrivateAttr()
    _custom_formatting: bool = PrivateAttr(default=False)
    _history: AnswerLog = PrivateAttr()
    _calls: CallFactory = PrivateAttr()

    def __init__(
        self,
        decoder: FidesDecoder | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """Wrap `decoder`, or build one from `model` and `tokenizer` (see also `from_model_id`)."""
        decoder = decoder_for(
            decoder, model=model, tokenizer=tokenizer, max_new_tokens=kwargs.get("max_new_tokens", 128)
        )
        if "model_name" not in kwargs:
            kwargs["model_name"] = str(getattr(decoder.model, "name_or_path", "") or "fides")
        default_config: Any = getattr(decoder.method, "config", None)  # FIDES's FidesConfig; None for other rules
        fold_fides_constants(kwargs, default_config)
        kwargs.setdefault("max_new_tokens", decoder.max_new_tokens)
        custom = kwargs.get("messages_to_prompt") is not None or kwargs.get("completion_to_prompt") is not None
        super().__init__(**kwargs)
        self._decoder = decoder
        self._custom_formatting = custom
        self._history = AnswerLog(self.history_size)
        if self.use_chat_template and not self._has_chat_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self._calls = CallFactory(
            decoder,
            max_batch_size=self.max_batch_size,
            batch_window_s=self.batch_window_s,
            use_chat_template=self.chat_template_active,
            no_context_path=self.no_context_path,
        )
        watch_programs()  # a program's call (FunctionCallingProgram) hands chat only its formatted messages

    @classmethod
    def from_model_id(
        cls, model_id: str, *, device: str = "auto", dtype: Any = None, config: FidesConfig | None = None, **kwargs: Any
    ) -> FidesLLM:
        """Load a bundled alias ("gemma3-270m", "smollm2-135m-instruct"), hub id, folder or .gguf and wrap it.

        config: the FIDES constants, e.g. `FidesConfig.from_file("calibrated.json")` from `fides-rag calibrate`."""
        decoder = decoder_for(
            model_id=model_id,
            device=device,
            dtype=dtype,
            config=config,
            max_new_tokens=kwargs.get("max_new_tokens", 128),
        )
        kwargs.setdefault("model_name", model_id)
        return cls(decoder, **kwargs)

    @classmethod
    def from_decoder(cls, decoder: FidesDecoder, **kwargs: Any) -> FidesLLM:
        """Share an already loaded decoder (one model can serve several FidesLLM objects)."""
        return cls(decoder, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "FidesLLM"

    # -- properties ---------------------------------------------------------------------------------

    @property
    def decoder(self) -> FidesDecoder:
        return self._decoder

    @property
    def _has_chat_template(self) -> bool:
        return bool(getattr(self._decoder.tokenizer, "chat_template", None))

    @property
    def chat_template_active(self) -> bool:
        """Whether prompts go through the tokenizer's chat template."""
        if self.use_chat_template is not None:
            return self.use_chat_template
        return self._has_chat_template and not self._custom_formatting

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._decoder.limits.context_window,
            num_output=self.max_new_tokens,
            model_name=self.model_name,
            is_chat_model=self.chat_template_active,
            is_function_calling_model=True,
            system_role=MessageRole.SYSTEM,
        )

    @property
    def last_result(self) -> GenerationResult | None:
        """The most recent GenerationResult of this LLM object (alphas, steps, prompts, notes)."""
        return self._history.last

    @property
    def history(self) -> list[dict[str, Any]]:
        """Recent generations, oldest first: {"result": GenerationResult, "info": the additional_kwargs}."""
        return self._history.entries()

    @property
    def effective_fides_config(self) -> FidesConfig:
        """The FIDES constants calls decode with: `fides_config`, else the wrapped decoder's."""
        default_config: Any = getattr(self._decoder.method, "config", None)
        return self.fides_config if self.fides_config is not None else default_config

    # -- LlamaIndex hooks: completion ---------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Decode `prompt`. kwargs: documents=[...] (contrastive path), no_context_prompt=str, and any of
        method, max_new_tokens, stop, do_sample, temperature, top_p, top_k, seed."""
        plan, options = self._complete_inputs(prompt, formatted, kwargs)
        return self._generate(plan, options)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        plan, options = self._complete_inputs(prompt, formatted, kwargs)
        return self._stream(plan, options)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        plan, options = self._complete_inputs(prompt, formatted, kwargs)
        return await asyncio.to_thread(self._generate, plan, options)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        plan, options = self._complete_inputs(prompt, formatted, kwargs)
        return iterate_in_thread(lambda: self._stream(plan, options))

    def _complete_inputs(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> tuple[ChatPlan, Any]:
        """The call's plan (one `predict` made, `_plan`, or one of `prompt`) and options."""
        plan = kwargs.pop("_plan", None)
        program = None if plan is not None else program_call(self)
        if program is not None:
            kwargs.update(program.call_defaults(kwargs))
        options = self._options(kwargs)
        return plan or self._pair_for_complete(prompt, formatted, kwargs, program, options.max_new_tokens), options

    # -- LlamaIndex hooks: chat ---------------------------------------------------------------------

    def _chat_inputs(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[ChatPlan, ToolCalling | None, CallOptions]:
        """The call's plan, tools (a ToolCalling, or None without tools) and options."""
        if "no_context_prompt" in kwargs:
            raise TypeError("chat does not take no_context_prompt=; use complete(..., no_context_prompt=...)")
        program = program_call(self)
        if program is not None:
            kwargs.update(program.call_defaults(kwargs))
        options = self._options(kwargs)
        return *self._chat_plan(messages, kwargs, options.max_new_tokens, program), options

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Chat; the context is documents=[...], the tool messages, or a system message rendered from a
        chat_context_templates entry. tools=[...] and tool_choice= as chat_with_tools passes them."""
        pair, calling, options = self._chat_inputs(messages, kwargs)
        return self._generate(pair, options, calling, chat=True)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        pair, calling, options = self._chat_inputs(messages, kwargs)
        return self._stream(pair, options, calling, chat=True)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        pair, calling, options = self._chat_inputs(messages, kwargs)
        return await asyncio.to_thread(self._generate, pair, options, calling, True)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        pair, calling, options = self._chat_inputs(messages, kwargs)
        return iterate_in_thread(lambda: self._stream(pair, options, calling, chat=True))

    # -- LlamaIndex hooks: prompt templates (query engines, response synthesizers, chat engines) ----

    @dispatcher.span
    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        """Context path: the prompt as formatted; no-context path: the same with context_str/context_msg emptied.

        prompt_args may also carry per-call options that the template does not use (method, max_new_tokens, ...).
        """
        plan, options = self._predict_pair(prompt, prompt_args)
        response = self.complete(plan.context_prompt or "", formatted=True, _plan=plan, **options)
        output = self._parse_output(response.text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        plan, options = self._predict_pair(prompt, prompt_args, stream=True)
        responses = self.stream_complete(plan.context_prompt or "", formatted=True, _plan=plan, **options)
        return stream_completion_response_to_tokens(responses)

    @dispatcher.span
    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        plan, options = self._predict_pair(prompt, prompt_args)
        response = await self.acomplete(plan.context_prompt or "", formatted=True, _plan=plan, **options)
        output = self._parse_output(response.text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        plan, options = self._predict_pair(prompt, prompt_args, stream=True)
        responses = await self.astream_complete(plan.context_prompt or "", formatted=True, _plan=plan, **options)
        return await astream_completion_response_to_tokens(responses)

    def _predict_pair(
        self, prompt: BasePromptTemplate, prompt_args: dict[str, Any], stream: bool = False
    ) -> tuple[ChatPlan, dict[str, Any]]:
        if stream and (prompt.output_parser is not None or self.output_parser is not None):
            raise NotImplementedError("Output parser is not supported for streaming.")
        template_args, call = split_template_args(prompt_args, prompt.template_vars, CALL_OPTIONS)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=template_args))
        self._log_template_data(prompt, **template_args)
        if any(k in call for k in ("tools", "tool_choice")):
            raise TypeError("predict does not take tools= or tool_choice=; use chat_with_tools(tools, ...)")
        if "documents" in call or "no_context_prompt" in call:
            raise TypeError(
                "predict takes its context from the template variables (context_str/context_msg), not documents="
            )
        options = self._options(call)
        return self._template_pair(prompt, template_args, options.max_new_tokens), call
