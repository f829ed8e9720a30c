"""Prompt pairing: the context prompt and the no-context prompt of one FidesLLM call, from a LlamaIndex prompt
template, a chat, or a completion with documents=, with the documents trimmed to the window."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
from llama_index.core.prompts.base import BasePromptTemplate

from fides_rag.chat import ChatPlan
from fides_rag.prompts import document_texts
from fides_rag.raw_prompts import fit_documents, question_only_text

from llama_index.llms.fides.context import (
    check_has_user_message,
    find_context,
    prompt_type,
    split_context_from_messages,
    with_context_message,
)
from llama_index.llms.fides.prompts import is_fides_rag_template
from llama_index.llms.fides.rendering import render_messages

logger = logging.getLogger("llama_index.llms.fides")


class CallPrompts:
    """The two prompts of one call and how they were found.

    With `question` and `documents` set, fides-rag's own 2-shot template builds both prompts (the
    decoder renders them); otherwise `context_prompt` / `no_context_prompt` are decoded as they are.
    `fallback` says why there is nothing to contrast (None: there is). `untrusted`: the texts in the raw prompts
    (the context as kept, the question) that are tokenised as plain text. `method`: a method the pair forces
    ('standard' where nothing is to be contrasted and nothing was asked that could not be done).
    """

    def __init__(
        self, context_prompt: str, no_context_prompt: str | None, info: dict[str, Any], *,
        question: str | None = None, documents: list[str] | None = None, fallback: str | None = None,
        untrusted: Sequence[str | None] = (), method: str | None = None,
    ) -> None:
        self.context_prompt = context_prompt
        self.no_context_prompt = no_context_prompt
        self.info = info
        self.question = question
        self.documents = documents
        self.fallback = fallback
        self.untrusted = [t for t in untrusted if t]
        self.method = method
        self._plan: ChatPlan | None = None
        if fallback is not None:
            info.setdefault("notes", []).insert(0, f"{fallback}: decoded with 'standard'")

    @property
    def uses_template(self) -> bool:
        return self.documents is not None

    def plan(self) -> ChatPlan:
        """The core's plan of this pair (what the call layer decodes)."""
        if self._plan is not None:
            return self._plan
        if self.uses_template:
            plan = ChatPlan("template", "documents", question=self.question or "", documents=list(self.documents or []))
        else:
            source = "none" if self.fallback is not None else self.info.get("documents_source", "context")
            no_ctx = self.no_context_prompt if self.no_context_prompt is not None else self.context_prompt
            plan = ChatPlan("prompts", source, context_prompt=self.context_prompt, no_context_prompt=no_ctx, untrusted=self.untrusted)
        plan.method = self.method or ("standard" if self.fallback is not None else None)
        plan.fallback, plan.notes = self.fallback, list(self.info.get("notes", []))
        plan.trimmed, plan.document_tokens = bool(self.info.get("documents_trimmed")), self.info.get("document_tokens")
        return plan

    def extras(self) -> dict[str, Any]:
        """What the pair adds to the FIDES record: the prompt's type, its context variables and context."""
        return {k: self.info[k] for k in ("prompt_type", "context_variables", "context") if k in self.info} | {
            "context_variables": self.info.get("context_variables", []), "prompt_type": self.info.get("prompt_type")}

    @classmethod
    def from_plan(cls, plan: ChatPlan, info: dict[str, Any]) -> CallPrompts:
        """The pair of a core `ChatPlan` (rendered prompts or fides-rag's template); its notes lead `info`'s."""
        info = {**info, "notes": [*plan.notes, *info.get("notes", [])], "documents_source": plan.source,
                "num_documents": len(plan.documents), "documents_trimmed": plan.trimmed, "document_tokens": plan.document_tokens}
        if plan.kind == "template":
            pair = cls("", None, info, question=plan.question or "", documents=list(plan.documents), method=plan.method)
        else:
            pair = cls(plan.context_prompt or "", plan.no_context_prompt, info, untrusted=plan.untrusted, method=plan.method)
        pair.fallback = plan.fallback  # its note is the plan's first
        pair._plan = plan
        return pair


def _contents(messages: Sequence[ChatMessage]) -> list[str | None]:
    """Every message's text, whatever its role: tokenised as plain text, so markup typed into an earlier turn or an
    assistant turn stays text."""
    return [m.content for m in messages]


class CallPairing:
    """FidesLLM's pairing methods (a mixin: it reads the LLM's fields, decoder and LlamaIndex formatting hooks)."""

    def _messages_text(self, messages: Sequence[ChatMessage]) -> str:
        if self.chat_template_active:
            return render_messages(self._decoder.tokenizer, messages)
        return self.messages_to_prompt(messages)

    def _completion_text(self, prompt: str, formatted: bool) -> str:
        if formatted:
            return prompt
        if self.chat_template_active and not self._custom_formatting:
            return render_messages(self._decoder.tokenizer, self._extend_messages([ChatMessage(role=MessageRole.USER, content=prompt)]))
        return self.completion_to_prompt(prompt)

    def _render_template(self, prompt: BasePromptTemplate, args: dict[str, Any]) -> str:
        """The prompt LlamaIndex's own predict would build, through the chat template when active."""
        if self.chat_template_active:
            return self._messages_text(self._get_messages(prompt, **args))
        return self._get_prompt(prompt, **args)

    def _no_context_text(self, emptied: str, question: str | None, info: dict[str, Any]) -> str:
        """The no-context path under `no_context_path`: the prompt with its context emptied, or the question alone
        under a neutral instruction in the chat form ('question'; without a question found, emptied, with a note)."""
        if self.no_context_path == "emptied":
            return emptied
        if question and question.strip():
            text = question_only_text(question)
            if self.chat_template_active:
                return self._messages_text([ChatMessage(role=MessageRole.USER, content=text)])
            return self.completion_to_prompt(text)
        note = "no_context_path='question' but the call has no question (query_str or a user message): the no-context path is the prompt with its context emptied"
        logger.warning(note)
        info.setdefault("notes", []).append(note)
        return emptied

    def _fit(self, render: Callable[[dict[str, str]], str], context: dict[str, str], max_new_tokens: int) -> tuple[str, dict[str, str], dict[str, Any]]:
        """Render the context path, trimming the longest context value until prompt + budget fits the window."""
        fitted = fit_documents(context, render, self._decoder.tokenizer, context_window=self._decoder.context_window, max_new_tokens=max_new_tokens)
        if not fitted.trimmed:
            return fitted.rendered, fitted.texts, {}
        return fitted.rendered, fitted.texts, {"notes": fitted.notes, "documents_trimmed": True, "document_tokens": fitted.document_tokens}

    def _template_pair(self, prompt: BasePromptTemplate, template_args: dict[str, Any], max_new_tokens: int) -> CallPrompts:
        context = find_context(prompt, template_args, self.context_variables, self, self.context_separator)
        info: dict[str, Any] = {"prompt_type": prompt_type(prompt, self), "context_variables": sorted(context)}
        if is_fides_rag_template(prompt):
            known = {**(getattr(prompt, "kwargs", None) or {}), **template_args}
            question = str(known.get("query_str", ""))
            texts = [t for t in context.values() if t.strip()]
            info["prompt_type"] = "fides_rag"
            fallback = None if texts else "the retrieved context (context_str) was empty"
            return CallPrompts("", None, info, question=question, documents=texts, fallback=fallback)
        if not any(v.strip() for v in context.values()):
            what = "was empty" if context else "is not in the prompt"
            why = f"the context variable ({', '.join(self.context_variables)}) {what}"
            question = template_args.get("query_str", (getattr(prompt, "kwargs", None) or {}).get("query_str"))
            return CallPrompts(self._render_template(prompt, {**template_args, **context}), None, info, fallback=why,
                              untrusted=[None if question is None else str(question)])
        ctx_text, used, trim = self._fit(lambda c: self._render_template(prompt, {**template_args, **c}), context, max_new_tokens)
        question = template_args.get("query_str", (getattr(prompt, "kwargs", None) or {}).get("query_str"))
        question = None if question is None else str(question)
        info.update(trim)
        no_ctx_text = self._no_context_text(self._render_template(prompt, {**template_args, **{k: "" for k in context}}), question, info)
        info["context"] = self.context_separator.join(used.values())
        return CallPrompts(ctx_text, no_ctx_text, info, untrusted=[*used.values(), question])

    def _documents_pair(self, query: str, documents: Any) -> CallPrompts:
        """complete(query, documents=...): fides-rag's own 2-shot template (as langchain-fides' documents=)."""
        texts = document_texts(documents)
        fallback = None if texts else "the documents given were empty"
        return CallPrompts("", None, {"prompt_type": "fides_rag", "context_variables": []}, question=query, documents=texts, fallback=fallback)

    def _chat_pair(self, messages: Sequence[ChatMessage], documents: Any, max_new_tokens: int) -> CallPrompts:
        check_has_user_message(messages)
        if documents is not None and len(messages) == 1 and not self.system_prompt:
            # One question: fides-rag's template, as complete(documents=) and langchain-fides' ChatFides.
            return self._documents_pair(messages[0].content or "", documents)
        question = next((m.content for m in reversed(messages) if m.role == MessageRole.USER), None)
        messages = self._extend_messages(list(messages))
        template = self.chat_context_templates[0] if self.chat_context_templates else DEFAULT_CONTEXT_TEMPLATE
        if documents is not None:
            context = self.context_separator.join(document_texts(documents))
            if context.strip():
                render = lambda c: self._messages_text(with_context_message(messages, template, c["context_str"]))  # noqa: E731
                ctx_text, used, trim = self._fit(render, {"context_str": context}, max_new_tokens)
                info = {"prompt_type": "chat", "context_variables": ["context_str"], "context": used["context_str"], **trim}
                return CallPrompts(ctx_text, self._no_context_text(render({"context_str": ""}), question, info), info,
                                  untrusted=[used["context_str"], question, *_contents(messages)])
        found = split_context_from_messages(messages, self.chat_context_templates)
        if found is not None:
            emptied, context = found
            info = {"prompt_type": "chat", "context_variables": ["system message"], "context": context}
            return CallPrompts(self._messages_text(messages), self._no_context_text(self._messages_text(emptied), question, info), info,
                              untrusted=[context, question, *_contents(messages)])
        why = "the documents given were empty" if documents is not None else "no documents= and no context system message in the chat"
        return CallPrompts(self._messages_text(messages), None, {"prompt_type": "chat"}, fallback=why, untrusted=[question, *_contents(messages)])

    def _pair_for_complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any], options: dict[str, Any]) -> CallPrompts:
        if kwargs.get("tools") or kwargs.get("tool_choice") is not None:
            raise TypeError("complete does not take tools= or tool_choice=; use chat_with_tools(tools, ...) or chat(messages, tools=[...])")
        documents, no_ctx = kwargs.get("documents"), kwargs.get("no_context_prompt")
        if no_ctx is not None:
            if documents is not None:
                raise TypeError("pass documents= or no_context_prompt=, not both")
            return CallPrompts(prompt if formatted else self._completion_text(prompt, False), no_ctx, {"prompt_type": "explicit"})
        if documents is not None:
            return self._documents_pair(prompt, documents)
        return CallPrompts(self._completion_text(prompt, formatted), None, {"prompt_type": "completion"}, fallback="no documents= were given",
                          untrusted=[] if formatted else [prompt])
