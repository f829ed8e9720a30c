"""ChatFides: a LangChain chat model that decodes with FIDES, taking the documents from the messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar, Literal
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable

from fides_rag import GenerationResult
from fides_rag.generation.streaming import iterate_in_thread
from fides_rag.prompts import document_texts
from fides_rag.tool_calls import ToolCallStream, ToolCalling

from langchain_fides._base import CALL_OPTIONS, CallOptions, FidesParams, Plan, logger
from langchain_fides._tools import check_tool_choice, lc_tool_call_chunks, lc_tool_calls, message_text, openai_tools, structured_output, tool_calling
from langchain_fides._discovery import model_parent_var, recorder
from langchain_fides.llms import _why_no_documents

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        return {"human": "user", "ai": "assistant"}.get(message.role, message.role)
    return _ROLES.get(message.type, "user")


def _note_missing_call(calling: ToolCalling | None, calls: list[Any], meta: dict[str, Any], opts: CallOptions) -> None:
    """A forced call that did not finish (cut at max_new_tokens) gives no call: say so in the notes and the log."""
    note = calling.missing_call_note(calls, opts.max_new_tokens) if calling is not None else None
    if note is not None:
        logger.warning(note)
        meta["notes"] = [*meta["notes"], note]


class ChatFides(FidesParams, BaseChatModel):
    """FIDES dual-path contrastive decoding as a LangChain chat model.

    The question is the last human message. The documents (first that applies): `documents=` given to
    invoke/.bind; `additional_kwargs["documents"]` on a message; documents retrieved earlier in the same
    chain run whose texts occur in the messages; with `system_message_as_context`, the system messages
    (as in LangChain's RAG tutorials, which put the retrieved context there). Context path: the
    conversation as given (documents that are not in it yet go into a leading system message, or, for a
    single question, fides-rag's own template); no-context path: the same with the document texts removed.

    An empty retrieval decodes with `standard` (the system message then holds only an instruction), and
    retrieved documents that are not verbatim in the messages make the system messages the context;
    both log a warning and leave a note in `response_metadata["notes"]`, and `strict=True` raises
    FidesFallbackError instead.

    Tools (`bind_tools`) enter both paths identically, through the chat template where it renders `tools=`, else
    as a system block in the Hermes format (`fides_rag.tool_calls`); tool messages are then the documents
    (`documents_source: "tool_messages"`). tool_choice "any"/"required" or a tool's name forces one valid call by
    grammar; `with_structured_output` is grammar-constrained too.

    >>> chat = ChatFides.from_model_id("smollm2-135m-instruct", max_new_tokens=32)
    >>> chat.invoke([("system", "Context: The Eiffel Tower is in Rome."), ("human", "Where is the Eiffel Tower?")])
    """

    _call_options: ClassVar[frozenset[str]] = CALL_OPTIONS | {"tools", "tool_choice"}

    system_message_as_context: bool = True
    """Treat system messages as the retrieved context when no documents were found otherwise."""
    documents_instruction: str = "Use the following documents to answer the question."
    """Heading of the system message that carries documents not already in the conversation."""
    timeout: float | None = None
    """Accepted for LangChain's standard parameters; local decoding has no timeout."""
    max_retries: int | None = None
    """Accepted for LangChain's standard parameters; local decoding is not retried."""

    @property
    def _llm_type(self) -> str:
        return "fides-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # BaseChatModel's cache key adds the call's kwargs (.bind(method=...), documents=...) to these.
        return {
            **self._fides_params(),
            "system_message_as_context": self.system_message_as_context,
            "documents_instruction": self.documents_instruction,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="fides",
            ls_model_name=kwargs.get("model") or self.model_id or type(self._dec.model).__name__,
            ls_model_type="chat",
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens if self.max_tokens is not None else self.max_new_tokens),
        )
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = float(temperature)
        stops = stop or self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    # -- tools and structured output ----------------------------------------------------------------

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Runnable[Any, AIMessage]:
        """Bind tools (anything `convert_to_openai_tool` takes); tool_choice: "auto" (default), "none", "any" or
        "required", a tool's name, True (the only tool) or {"type": "function", "function": {"name": ...}}. A forced
        choice is decoded under a grammar that admits exactly one valid call."""
        formatted = openai_tools(tools)
        check_tool_choice(tool_choice, formatted)  # a call with two different tools of one name fails when made
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self, schema: Any = None, *, method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False, **kwargs: Any,
    ) -> Runnable[Any, Any]:
        """Answers that parse as `schema` (pydantic class, TypedDict or JSON schema dict), enforced by a grammar:
        json_schema constrains the answer to the schema, function_calling forces a call of it as a tool, json_mode
        to any JSON object. include_raw: {"raw", "parsed", "parsing_error"} as in langchain-core."""
        kwargs.pop("strict", None)  # the grammar is always strict
        if kwargs:
            raise ValueError(f"unsupported arguments for with_structured_output: {sorted(kwargs)}")
        return structured_output(self.bind, self.bind_tools, schema, method, include_raw)

    # -- plan ---------------------------------------------------------------------------------------

    def _plan(self, messages: list[BaseMessage], kwargs: dict[str, Any], parent_run_id: UUID | None, max_new: int,
              calling: ToolCalling | None = None) -> Plan:
        chat = self._chat.with_tools(calling)
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage) or (isinstance(m, ChatMessage) and m.role in ("user", "human"))]
        if not humans:
            raise ValueError(
                f"ChatFides needs a human message (the question); got {[type(m).__name__ for m in messages]}"
            )
        render = calling or ToolCalling(self._dec.tokenizer, [])
        turns = [(_role(m), message_text(m, render)) for m in messages]
        last = messages[humans[-1]]
        question = last.text
        documents, source, fides_question = kwargs.get("documents"), "documents", None
        if documents is None:
            for m in reversed(messages):
                if m.additional_kwargs.get("documents") is not None:
                    documents, source = m.additional_kwargs["documents"], "message"
                    fides_question = m.additional_kwargs.get("fides_question") if m is last else None
                    break
        if documents is not None:
            return chat.with_documents(turns, document_texts(documents), source, max_new, question=question, template_question=fides_question)
        tools = chat.from_tool_turns(turns, max_new, question=question)
        if tools is not None:
            return tools
        contents = [c for _, c in turns]
        found = recorder.documents_for(parent_run_id, contents)
        retrieved = recorder.retrieved_for(parent_run_id)
        if found:
            return self._retriever_plan(turns, found, retrieved, max_new, "the messages", question, chat=chat)
        systems = [i for i, m in enumerate(messages) if isinstance(m, SystemMessage) and m.text.strip()]
        use_systems = self.system_message_as_context and bool(systems)
        if retrieved is not None and not retrieved:
            # An empty retrieval: the system message holds only its instruction, nothing to contrast.
            return self._plain_plan(turns, _why_no_documents(retrieved, "the messages"), question, chat=chat)
        if use_systems:
            plan = self._prompt_plan(turns, [turns[i][1] for i in systems], "system_message", max_new, drop_in_no_context=systems, question=question, chat=chat)
            if retrieved:
                return plan.fall_back(
                    _why_no_documents(retrieved, "the messages"),
                    "took the whole system message(s) as the context instead (system_message_as_context=True)",
                )
            note = "no documents were given, attached or retrieved: the system message(s) were taken as the context (system_message_as_context=True)"
            logger.info(note)
            plan.notes.insert(0, note)
            return plan
        if calling is not None and not retrieved:  # an agent's first turn: its evidence comes back as tool messages
            return chat.plain(turns, "tools are bound and no tool has answered yet", question, fallback=False)
        why = _why_no_documents(retrieved, "the messages") if retrieved else "no documents were given, attached or retrieved in this run"
        return self._plain_plan(turns, why, question, chat=chat)

    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]) -> tuple[CallOptions, Plan, ToolCalling | None]:
        """The call's options, its tools (their grammar as the constraint when a call is forced) and its plan."""
        opts = self._options(stop, kwargs)
        calling = tool_calling(self._dec.tokenizer, kwargs)
        forced = calling.constraint() if calling else None
        if forced is not None:
            if opts.constraint:
                raise ValueError(f"a forced tool_choice is decoded under its own grammar; drop {', '.join(opts.constraint)}=")
            opts.constraint = {"json_schema": forced}
        return opts, self._plan(messages, kwargs, parent, opts.max_new_tokens, calling), calling

    # -- hooks ----------------------------------------------------------------------------------------

    def _message_extras(self, plan: Plan, opts: CallOptions, result: GenerationResult, calling: ToolCalling | None = None) -> tuple[dict[str, Any], UsageMetadata]:
        meta = self._metadata(plan, opts, result)
        if calling is not None:
            meta["tool_format"] = "native" if self._chat.with_tools(calling).native_tools else "fallback"
            meta["tool_choice"] = calling.tool_choice
        usage = UsageMetadata(
            input_tokens=result.prompt_tokens,
            output_tokens=len(result.token_ids),
            total_tokens=result.prompt_tokens + len(result.token_ids),
        )
        return meta, usage

    def _generate_one(self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]) -> ChatResult:
        opts, plan, calling = self._prepare(messages, stop, parent, kwargs)
        result = self._decode(plan, opts)
        meta, usage = self._message_extras(plan, opts, result, calling)
        content, calls = calling.parse(result.text) if calling else (result.text, [])
        _note_missing_call(calling, calls, meta, opts)
        message = AIMessage(content=content, tool_calls=lc_tool_calls(calls), response_metadata=meta, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=meta)], llm_output={"model_name": meta["model_name"]})

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> ChatResult:
        return self._generate_one(messages, stop, run_manager.parent_run_id if run_manager else None, kwargs)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> ChatResult:
        parent = run_manager.parent_run_id if run_manager else None
        return await asyncio.to_thread(self._generate_one, messages, stop, parent, kwargs)

    def _stream_items(self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        opts, plan, calling = self._prepare(messages, stop, parent, kwargs)
        calls = ToolCallStream(calling) if calling else None
        for item in self._decode_stream(plan, opts):
            if isinstance(item, GenerationResult):
                meta, usage = self._message_extras(plan, opts, item, calling)
                rest, found = calls.finish() if calls else ("", [])
                _note_missing_call(calling, found, meta, opts)
                chunk = AIMessageChunk(content=rest, tool_call_chunks=lc_tool_call_chunks(found), response_metadata=meta,
                                       usage_metadata=usage, chunk_position="last")
                yield ChatGenerationChunk(message=chunk, generation_info=meta)
            else:
                text = calls.feed(item) if calls else item
                if text:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=text))

    def _stream(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        parent = run_manager.parent_run_id if run_manager else model_parent_var.get()
        for chunk in self._stream_items(messages, stop, parent, kwargs):
            if run_manager and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        parent = run_manager.parent_run_id if run_manager else model_parent_var.get()
        async for chunk in iterate_in_thread(lambda: self._stream_items(messages, stop, parent, kwargs)):
            if run_manager and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
