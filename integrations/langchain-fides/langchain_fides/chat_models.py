"""ChatFides: a LangChain chat model that decodes with FIDES, taking the documents from the messages."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal
from uuid import UUID

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable

from fides_rag.calls import DOCUMENTS_INSTRUCTION, Answer, ChatPlan, ToolCalling, tool_choice_name, turn_of
from fides_rag.prompts.template import document_texts
from langchain_fides._base import CALL_OPTIONS, FidesParams
from langchain_fides._discovery import recorder
from langchain_fides._tools import lc_tool_calls, openai_tools, structured_output


class ChatFides(FidesParams, BaseChatModel):  # type: ignore[misc]  # FidesParams' _generate/_stream serve both models (LangChain's names differ)
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
    as a system block in the Hermes format (`fides_rag.calls.ToolCalling`); tool messages are then the documents
    (`documents_source: "tool_messages"`). tool_choice "any"/"required" or a tool's name forces one valid call by
    grammar; `with_structured_output` is grammar-constrained too.

    >>> chat = ChatFides.from_model_id("smollm2-135m-instruct", max_new_tokens=32)
    >>> chat.invoke([("system", "Context: The Eiffel Tower is in Rome."), ("human", "Where is the Eiffel Tower?")])
    """

    _call_options: ClassVar[tuple[str, ...]] = (*CALL_OPTIONS, "tools", "tool_choice")

    system_message_as_context: bool = True
    """Treat system messages as the retrieved context when no documents were found otherwise."""
    documents_instruction: str = DOCUMENTS_INSTRUCTION
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
            ls_max_tokens=kwargs.get(
                "max_tokens", self.max_tokens if self.max_tokens is not None else self.max_new_tokens
            ),
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
        tool_choice_name(
            tool_choice, [t["function"]["name"] for t in formatted]
        )  # two tools of one name fail when called
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[Any, Any]:
        """Answers that parse as `schema` (pydantic class, TypedDict or JSON schema dict), enforced by a grammar:
        json_schema constrains the answer to the schema, function_calling forces a call of it as a tool, json_mode
        to any JSON object. include_raw: {"raw", "parsed", "parsing_error"} as in langchain-core."""
        kwargs.pop("strict", None)  # the grammar is always strict
        if kwargs:
            raise ValueError(f"unsupported arguments for with_structured_output: {sorted(kwargs)}")
        return structured_output(self.bind, self.bind_tools, schema, method, include_raw)

    # -- the call -----------------------------------------------------------------------------------

    def _plan(
        self,
        messages: list[BaseMessage],
        kwargs: dict[str, Any],
        parent: UUID | None,
        max_new: int,
        calling: ToolCalling | None,
    ) -> ChatPlan:
        turns = [
            turn_of(m.role if isinstance(m, ChatMessage) else m.type, m.text, getattr(m, "tool_calls", None) or ())
            for m in messages
        ]
        if "user" not in (r for r, _ in turns):
            raise ValueError(
                f"ChatFides needs a human message (the question); got {[type(m).__name__ for m in messages]}"
            )
        documents, source, template_question = kwargs.get("documents"), "documents", None
        if documents is None:
            attached = next((m for m in reversed(messages) if m.additional_kwargs.get("documents") is not None), None)
            if attached is not None:
                documents, source = attached.additional_kwargs["documents"], "message"
                last_human = [m for m, (r, _) in zip(messages, turns) if r == "user"][-1]
                template_question = attached.additional_kwargs.get("fides_question") if attached is last_human else None
        retrieved = recorder.retrieved_for(parent)
        found = recorder.documents_for(parent, [c for _, c in turns]) if documents is None else []
        return self._planner(calling).conversation(
            turns,
            max_new,
            documents=None if documents is None else document_texts(documents),
            source=source,
            template_question=template_question,
            found=found,
            system_as_context=self.system_message_as_context,
            retrieved=retrieved,
        )

    def _prepared(
        self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]
    ) -> Any:
        opts = self._options(stop, kwargs)
        calling = self._calls.tools(kwargs.get("tools"), kwargs.get("tool_choice"))
        return self._call(self._plan(messages, kwargs, parent, opts.max_new_tokens, calling), opts, calling)

    @staticmethod
    def _message(answer: Answer, chunk: bool = False) -> Any:
        counts = answer.usage
        usage = UsageMetadata(  # type: ignore[typeddict-item]  # the token details are unknown, so left out
            input_tokens=counts["prompt_tokens"],
            output_tokens=counts["completion_tokens"],
            total_tokens=counts["total_tokens"],
        )
        if chunk:
            return AIMessageChunk(
                content=answer.text,
                tool_call_chunks=lc_tool_calls(answer.tool_calls, chunks=True),
                response_metadata=answer.record,
                usage_metadata=usage,
                chunk_position="last",
            )
        return AIMessage(
            content=answer.text,
            tool_calls=lc_tool_calls(answer.tool_calls),
            response_metadata=answer.record,
            usage_metadata=usage,
        )

    def _results(
        self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]
    ) -> ChatResult:
        answer = self._run(self._prepared(messages, stop, parent, kwargs))
        generation = ChatGeneration(message=self._message(answer), generation_info=answer.record)
        return ChatResult(generations=[generation], llm_output={"model_name": answer.record["model_name"]})

    def _stream_items(
        self, messages: list[BaseMessage], stop: list[str] | None, parent: UUID | None, kwargs: dict[str, Any]
    ) -> Iterator[ChatGenerationChunk]:
        for delta, answer in self._prepared(messages, stop, parent, kwargs).deltas():
            if answer is None:
                yield ChatGenerationChunk(message=AIMessageChunk(content=delta))
            else:  # the last chunk: the last delta, the calls, the record
                answer.text = delta
                self._answered(self._answers.add(answer))
                yield ChatGenerationChunk(message=self._message(answer, chunk=True), generation_info=answer.record)
