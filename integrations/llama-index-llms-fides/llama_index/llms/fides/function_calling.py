"""FidesLLM's FunctionCallingLLM hooks (a mixin): tools in front of both paths, tool results as the evidence, calls read
back into `ChatMessage.additional_kwargs["tool_calls"]`.

A conversation with tools or tool messages is planned by the core (`fides_rag.chat.ChatPrompts`): the tool definitions
enter both paths identically (through the chat template where it renders `tools=`, else as a system block in the
fallback format of `fides_rag.tool_calls`), and the tool messages' contents are the context path's documents, emptied on
the no-context path (`documents_source: "tool_messages"`). tool_required, "required" or a tool's name forces one valid
call by grammar.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, ChatResponseGen, CompletionResponse, CompletionResponseGen, MessageRole

from fides_rag.chat import ChatPrompts
from fides_rag.prompts import document_texts
from fides_rag.tool_calls import ToolCallStream, ToolCalling

from llama_index.llms.fides.context import check_has_user_message
from llama_index.llms.fides.pairing import PromptPair
from llama_index.llms.fides.tools import choice_name, message_turn, note_missing_call, openai_calls, tool_calling, tool_selections

TOOL_ROLES = (MessageRole.TOOL, MessageRole.FUNCTION)


class FunctionCalling:
    """FidesLLM's tool hooks (reads the LLM's fields and decoder)."""

    # -- FunctionCallingLLM hooks ---------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self, tools: Sequence[Any], user_msg: str | ChatMessage | None = None, chat_history: list[ChatMessage] | None = None,
        verbose: bool = False, allow_parallel_tool_calls: bool = False, tool_required: bool = False, tool_choice: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """chat's arguments: the messages, the tools and the choice (tool_required, "required" or a tool's name force a
        valid call by grammar; OpenAI's {"type": "function", "function": {"name": ...}} names one)."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg)
        return {"messages": messages, "tools": list(tools), "tool_choice": choice_name(tool_choice, tool_required), **kwargs}

    def _validate_chat_with_tools_response(
        self, response: ChatResponse, tools: Sequence[Any], allow_parallel_tool_calls: bool = False, **kwargs: Any
    ) -> ChatResponse:
        """Without allow_parallel_tool_calls, only the first call is kept."""
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not allow_parallel_tool_calls and len(calls) > 1:
            response.message.additional_kwargs["tool_calls"] = calls[:1]
        return response

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any) -> list[Any]:
        """The response's calls as ToolSelections; with error_on_no_tool_call, none raises a ValueError."""
        selections = tool_selections(response)
        if not selections and error_on_no_tool_call:
            raise ValueError(f"Expected at least one tool call, but got 0 tool calls; the answer was {response.message.content!r}")
        return selections

    # -- planning and responses -----------------------------------------------------------------------

    @property
    def _chat_prompts(self) -> ChatPrompts:
        """The core's conversation planner with this LLM's chat-template use and no-context design."""
        dec = self._decoder
        return ChatPrompts(dec.tokenizer, context_window=dec.context_window, use_chat_template=self.chat_template_active,
                           no_context_path=self.no_context_path, template=dec.prompt_template)

    def _tool_inputs(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], options: dict[str, Any]) -> tuple[PromptPair, ToolCalling | None] | None:
        """The pair of a conversation with tools or tool messages (None: neither, the ordinary chat pairing applies);
        a forced call's grammar goes into `options`."""
        calling = tool_calling(self._decoder.tokenizer, kwargs)
        if calling is None and not any(m.role in TOOL_ROLES for m in messages):
            return None
        forced = calling.constraint() if calling else None
        if forced is not None:
            if options["constraint"]:
                raise ValueError(f"a forced tool_choice is decoded under its own grammar; drop {', '.join(options['constraint'])}=")
            options["constraint"] = {"json_schema": forced}
        return self._tool_pair(messages, calling, kwargs.get("documents"), options["max_new_tokens"]), calling

    def _tool_pair(self, messages: Sequence[ChatMessage], calling: ToolCalling | None, documents: Any, max_new_tokens: int) -> PromptPair:
        check_has_user_message(messages)
        chat = self._chat_prompts.with_tools(calling)
        render = calling or ToolCalling(self._decoder.tokenizer, [])
        turns = [message_turn(m, render) for m in self._extend_messages(list(messages))]
        question = next((m.content for m in reversed(messages) if m.role == MessageRole.USER), None)
        info: dict[str, Any] = {"prompt_type": "chat", "context_variables": []}
        if calling is not None:
            info.update(tool_format="native" if chat.native_tools else "fallback", tool_choice=calling.tool_choice)
        if documents is not None:
            plan = chat.with_documents(turns, document_texts(documents), "documents", max_new_tokens, question=question)
        else:
            plan = chat.from_tool_turns(turns, max_new_tokens, question=question)
        if plan is None and calling is not None:  # an agent's first turn: its evidence comes back as tool messages
            plan = chat.plain(turns, "tools are bound and no tool has answered yet", question, fallback=False)
        elif plan is None:
            plan = chat.plain(turns, "no tool message holds a result", question)
        if plan.source == "tool_messages":
            info["context_variables"] = ["tool messages"]
        return PromptPair.from_plan(plan, info)

    def _chat_response(self, response: CompletionResponse, calling: ToolCalling | None, options: dict[str, Any]) -> ChatResponse:
        """The completion as a chat response; with tools, the calls parsed out of its text into additional_kwargs."""
        content, calls = calling.parse(response.text) if calling else (response.text, [])
        if calling is not None:
            note_missing_call(calling, calls, response.additional_kwargs, options["max_new_tokens"])
        extra = {"tool_calls": openai_calls(calls)} if calls else {}
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=content, additional_kwargs=extra),
            delta=response.delta, raw=response.raw, additional_kwargs=response.additional_kwargs,
        )

    def _chat_stream(self, responses: CompletionResponseGen, calling: ToolCalling | None, options: dict[str, Any]) -> ChatResponseGen:
        """Streamed chat responses; with tools, a possible call is held back and the last response carries the calls."""
        if calling is None:
            yield from (self._chat_response(r, None, options) for r in responses)
            return
        stream, shown = ToolCallStream(calling), ""
        for response in responses:
            new = stream.feed(response.delta or "")
            if response.raw is None:
                if new:
                    shown += new
                    yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=shown), delta=new)
                continue
            rest, _ = stream.finish()
            final = self._chat_response(CompletionResponse(text=response.text, delta=new + rest, raw=response.raw,
                                                           additional_kwargs=response.additional_kwargs), calling, options)
            yield final
