"""The core's plan (`fides_rag.calls.ChatPlan`) of one FidesLLM call, from a LlamaIndex prompt template, a chat, or a
completion with documents=: the core planner renders the template with and without its context variables; this
mixin only says how LlamaIndex renders them (its formatting hooks, its chat messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.llms.fides.context import CONTEXT_VARIABLES, find_context, prompt_type
from llama_index.llms.fides.programs import ProgramCall
from llama_index.llms.fides.prompts import is_fides_rag_template
from llama_index.llms.fides.tools import message_calls

from fides_rag.calls import STANDARD, ChatPlan, ChatPrompts, ContextMessages, ToolCalling, role_of, turn_of
from fides_rag.prompts.raw import render_chat
from fides_rag.prompts.template import document_texts

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder


def _extra(prompt_type: str | None, variables: Sequence[str] = (), context: str | None = None) -> dict[str, Any]:
    """What a plan adds to the FIDES record: the prompt's type, its context variables and context."""
    return {
        "prompt_type": prompt_type,
        "context_variables": list(variables),
        **({} if context is None else {"context": context}),
    }


def _no_program_context(variables: Sequence[str], where: str) -> str:
    """Why a program's call decodes 'standard': no context variable's text is in what it hands the LLM (`where`)."""
    return (
        f"the program's prompt has no context variable ({', '.join(variables)}) whose text is in its {where}, and "
        "llm_kwargs has no documents="
    )


class CallPairing:
    """FidesLLM's pairing methods (a mixin: it reads the LLM's fields, decoder and LlamaIndex formatting hooks)."""

    if TYPE_CHECKING:  # what FidesLLM and its LlamaIndex base give this mixin
        _calls: Any
        _decoder: FidesDecoder
        chat_template_active: Any
        context_variables: Any
        context_separator: Any
        chat_context_templates: Any
        messages_to_prompt: Any
        completion_to_prompt: Any
        _custom_formatting: Any
        _extend_messages: Any
        _get_messages: Any
        _get_prompt: Any

    @property
    def _chat_prompts(self) -> ChatPrompts:
        """The core's planner with this LLM's chat-template use and no-context design."""
        return self._calls.planner()

    def _messages_text(self, messages: Sequence[ChatMessage]) -> str:
        """The messages as one prompt: the chat template (the core's role map; tool results as user turns), else
        LlamaIndex's messages_to_prompt."""
        if not self.chat_template_active:
            return self.messages_to_prompt(messages)
        turns = [("user" if role_of(m.role) == "tool" else role_of(m.role), m.content or "") for m in messages]
        return render_chat(self._decoder.tokenizer, [{"role": r, "content": c} for r, c in turns])

    def _completion_text(self, prompt: str, formatted: bool = False) -> str:
        if formatted:
            return prompt
        if self.chat_template_active and not self._custom_formatting:
            return self._messages_text(self._extend_messages([ChatMessage(role=MessageRole.USER, content=prompt)]))
        return self.completion_to_prompt(prompt)

    def _question_text(self, text: str) -> str:
        """The no-context path's question alone under no_context_path='question', in the chat form."""
        if self.chat_template_active:
            return self._messages_text([ChatMessage(role=MessageRole.USER, content=text)])
        return self.completion_to_prompt(text)

    def _render_template(self, prompt: BasePromptTemplate, args: dict[str, Any]) -> str:
        """The prompt LlamaIndex's own predict would build, through the chat template when active."""
        if self.chat_template_active:
            return self._messages_text(self._get_messages(prompt, **args))
        return self._get_prompt(prompt, **args)

    def _template_pair(
        self, prompt: BasePromptTemplate, template_args: dict[str, Any], max_new_tokens: int
    ) -> ChatPlan:
        context = find_context(prompt, template_args, self.context_variables, self, self.context_separator)
        question = template_args.get("query_str", (getattr(prompt, "kwargs", None) or {}).get("query_str"))
        question = None if question is None else str(question)
        if is_fides_rag_template(prompt):
            plan = self._chat_prompts.fides_template(
                question or "", list(context.values()), why_empty="the retrieved context (context_str) was empty"
            )
            plan.extra = _extra("fides_rag", sorted(context))
            return plan
        return self._chat_prompts.variables_pair(
            lambda c: self._render_template(prompt, {**template_args, **c}),
            context,
            max_new_tokens,
            variables=self.context_variables,
            separator=self.context_separator,
            question=question,
            question_prompt=self._question_text,
            extra=_extra(prompt_type(prompt, self), sorted(context)),
        )

    def _documents_pair(self, query: str, documents: Any) -> ChatPlan:
        """complete(query, documents=...): fides-rag's own 2-shot template (as langchain-fides' documents=)."""
        plan = self._chat_prompts.fides_template(query, document_texts(documents))
        plan.extra = _extra("fides_rag")
        return plan

    def _chat_plan(
        self,
        messages: Sequence[ChatMessage],
        kwargs: dict[str, Any],
        max_new_tokens: int,
        program: ProgramCall | None = None,
    ) -> tuple[ChatPlan, ToolCalling | None]:
        """The plan of a chat and its tools (None without tools). The context: documents= (one question: fides-rag's
        template; a longer chat: the first chat_context_templates entry's system message), the tool messages, the
        context variables of the `program` calling (`program_call`), or a system message rendered from a
        chat_context_templates entry."""
        calling = self._calls.tools(kwargs.get("tools"), kwargs.get("tool_choice"))
        turns = [turn_of(m.role, m.content or "", message_calls(m)) for m in self._extend_messages(list(messages))]
        documents = None if kwargs.get("documents") is None else document_texts(kwargs["documents"])
        variables = {
            "tool_messages": ["tool messages"],
            "context": ["context_str" if documents is not None else "system message"],
        }
        source = "documents"
        if documents is not None or any(r == "tool" for r, _ in turns):
            program = None  # the documents are given, or the tools answered: the program adds none
        if program is not None:
            found = self._program_context(program, turns)
            if found is not None:  # a program's call (FunctionCallingProgram): its context variables' text
                documents, variables["context"], source = found[0], found[1], "context"
        if calling is not None or source == "context" or any(r == "tool" for r, _ in turns):  # the core's chat
            plan = self._calls.planner(calling).conversation(
                turns, max_new_tokens, documents=documents, source=source, system_as_context=False
            )
        else:
            context = ContextMessages(
                (self.chat_context_templates or [DEFAULT_CONTEXT_TEMPLATE])[0],
                self.chat_context_templates,
                CONTEXT_VARIABLES,
                self.context_separator,
            )
            planner = self._calls.planner(
                context_messages=context,
                render_text=lambda turns: self.messages_to_prompt([ChatMessage(role=r, content=c) for r, c in turns]),
                question_prompt=self._question_text,
            )
            plan = planner.conversation(
                turns,
                max_new_tokens,
                documents=documents,
                template_first=True,
                template_question=turns[-1][1],
                system_as_context=False,
            )
        if program is not None and documents is None and plan.fallback is None:  # a program with nothing to contrast
            plan.fall_back(_no_program_context(self.context_variables, "messages"), STANDARD)
        plan.extra = {
            **_extra("fides_rag" if plan.kind == "template" else "chat", variables.get(plan.source, [])),
            **plan.extra,
        }
        return plan, calling

    def _program_context(
        self, call: ProgramCall, turns: Sequence[tuple[str, str]]
    ) -> tuple[list[str], list[str]] | None:
        """The texts of the context variables (and their names) of a program's call on this LLM, when its messages
        hold them verbatim; None when its template has no context variable or they are not in the messages."""
        context = find_context(call.prompt, call.arguments, self.context_variables, self, self.context_separator)
        texts = [t for t in context.values() if t.strip()]
        if not context or not all(any(t in c for _, c in turns) for t in texts):
            return None
        return texts, sorted(context)

    def _pair_for_complete(
        self,
        prompt: str,
        formatted: bool,
        kwargs: dict[str, Any],
        program: ProgramCall | None,
        max_new_tokens: int,
    ) -> ChatPlan:
        if kwargs.get("tools") or kwargs.get("tool_choice") is not None:
            raise TypeError(
                "complete does not take tools= or tool_choice=; use chat_with_tools(tools, ...) or chat(messages, "
                "tools=[...])"
            )
        documents, no_ctx = kwargs.get("documents"), kwargs.get("no_context_prompt")
        if no_ctx is not None:
            if documents is not None:
                raise TypeError("pass documents= or no_context_prompt=, not both")
            return ChatPlan(
                "prompts",
                "context",
                context_prompt=self._completion_text(prompt, formatted),
                no_context_prompt=no_ctx,
                extra=_extra("explicit"),
            )
        if documents is not None:
            return self._documents_pair(prompt, documents)
        if program is not None:  # a program's completion (LLMTextCompletionProgram): its context variables' text
            return self._program_completion_pair(program, prompt, formatted, max_new_tokens)
        return ChatPlan.as_given(
            self._completion_text(prompt, formatted),
            "no documents= were given",
            untrusted=[] if formatted else [prompt],
            extra=_extra("completion"),
        )

    def _program_completion_pair(
        self, program: ProgramCall, prompt: str, formatted: bool, max_new_tokens: int
    ) -> ChatPlan:
        """A program's prompt, formatted by the program, with its context variables emptied on the no-context path
        (as `predict` pairs a template); 'standard', said, when they hold no text of the prompt."""
        context = find_context(program.prompt, program.arguments, self.context_variables, self, self.context_separator)
        if not context or not all(t in prompt for t in context.values() if t.strip()):
            return ChatPlan.as_given(
                self._completion_text(prompt, formatted),
                _no_program_context(self.context_variables, "prompt"),
                untrusted=[] if formatted else [prompt],
                extra=_extra("completion"),
            )
        return self._chat_prompts.variables_pair(
            lambda c: self._completion_text(
                program.prompt.format(llm=program.llm, **{**program.arguments, **c}), formatted
            ),
            context,
            max_new_tokens,
            variables=self.context_variables,
            separator=self.context_separator,
            question=None,
            question_prompt=self._question_text,
            extra=_extra(prompt_type(program.prompt, self), sorted(context)),
        )
