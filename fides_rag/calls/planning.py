"""A conversation and its documents become the two prompts of dual-path decoding, in one place that every chat
entry point shares (LangChain's ChatFides and FidesLLM, the OpenAI-compatible server), so the same messages and
documents give the same prompts, and the same answers, everywhere.

The context path is the conversation as given. The no-context path is the same conversation with every document
text removed (`no_context_path="emptied"`), or the question alone under the neutral instruction ("question").
Documents that are not in the conversation yet are placed in it: a single question gets fides-rag's own template;
a longer conversation gets a leading system turn that lists them. Tool results are documents too: an agent's
retrieval comes back as tool turns, which form the context path and are emptied on the no-context path.

Tools: `ChatPrompts(..., tools=ToolCalling(...))` or `prompts.with_tools(calling)` puts the tool definitions in
front of BOTH paths identically: through the chat template's `tools=` where the template renders them (tool turns
then keep their `tool` role), else as a leading system block in the fallback format (`ToolCalling.fallback_text`,
tool turns as `<tool_response>` user turns). With tools bound, an emptied tool turn stays (the tool returned nothing).
An assistant turn's earlier calls are part of its text (`ToolCalling.render_calls`), written by the caller.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fides_rag.generation.requests import PromptPair
from fides_rag.prompts import PromptTemplate, TemplateLeftovers, template_stops
from fides_rag.result import GenerationResult
from fides_rag.raw_prompts import check_no_context_path, fit_documents, question_only_text, render_chat
from fides_rag.tool_calls import ToolCalling

logger = logging.getLogger("fides_rag.chat")

Turn = tuple[str, str]
"""(role, content), role one of user, assistant, system, tool."""
DOCUMENTS_INSTRUCTION = "Use the following documents to answer the question."


@dataclass
class ChatPlan:
    """How one conversation decodes: fides-rag's template (question + documents) or two rendered prompts."""

    kind: Literal["template", "prompts"]
    source: str
    """Where the documents came from: documents, prompt_value, message, retriever, system_message, tool_messages or none."""
    question: str | None = None
    documents: list[str] = field(default_factory=list)
    context_prompt: str | None = None
    no_context_prompt: str | None = None
    method: str | None = None
    """Forces a method ('standard' when there are no documents)."""
    fallback: str | None = None
    """Why the documents could not be used as asked (None: they were); a strict caller raises with this."""
    notes: list[str] = field(default_factory=list)
    trimmed: bool = False
    document_tokens: tuple[int, int] | None = None
    untrusted: list[str] = field(default_factory=list)
    """Texts in the rendered prompts (the documents as kept, the question) that are tokenised as plain text."""

    def fall_back(self, why: str, consequence: str) -> ChatPlan:
        """Record a fallback: `why` for a strict caller's error, `why: consequence` as the note and the warning."""
        self.fallback = why
        self.notes.insert(0, f"{why}: {consequence}")
        return self

    def stop_strings(self, stop: Sequence[str], template: PromptTemplate) -> list[str]:
        """`stop`, plus the template's own stops when this plan decodes with fides-rag's template."""
        stops = list(stop)
        if self.kind == "template":
            stops += [s for s in template_stops(template) if s not in stops]
        return stops

    def finish(self, result: GenerationResult, template: PromptTemplate) -> GenerationResult:
        """The answer without fides-rag's template leftovers (noted) when this plan used that template."""
        if self.kind != "template":
            return result
        text, notes = TemplateLeftovers(template).clean(result.text, truncated=result.finish_reason == "length")
        return dataclasses.replace(result, text=text, notes=[*result.notes, *notes]) if notes else result

    def metadata(self, result: GenerationResult) -> dict[str, Any]:
        """The result's metadata with what the plan knows: its notes first, where the documents came from, trimming."""
        return {
            **result.to_metadata(),
            "notes": list(dict.fromkeys([*self.notes, *result.notes])),
            "documents_source": self.source,
            "num_documents": len(self.documents),
            "documents_trimmed": self.trimmed or result.documents_trimmed,
            "document_tokens": self.document_tokens or result.document_tokens,
        }

    def prompt(self) -> tuple[Any, list[str] | None]:
        """What the request builder takes: (question, documents) for the template, (PromptPair, None) otherwise."""
        if self.kind == "template":
            return self.question or "", list(self.documents)
        return PromptPair(self.context_prompt or "", self.no_context_prompt or "", untrusted=tuple(self.untrusted)), None


class ChatPrompts:
    """Renders conversations with one tokenizer's chat template (or plain `Role:` lines) and plans their two paths."""

    def __init__(
        self, tokenizer: Any, *, context_window: int, use_chat_template: bool, no_context_path: str = "emptied",
        documents_instruction: str = DOCUMENTS_INSTRUCTION, template: PromptTemplate | None = None,
        tools: ToolCalling | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_window = context_window
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.no_context_path = check_no_context_path(no_context_path)
        self.documents_instruction = documents_instruction
        self.template = template or PromptTemplate()
        self.tools = tools

    def with_tools(self, tools: ToolCalling | None) -> ChatPrompts:
        """The same planner with `tools` in front of both paths (None: without tools)."""
        planner = copy.copy(self)
        planner.tools = tools
        return planner

    @property
    def native_tools(self) -> bool:
        """Tools are rendered by the chat template (else by the fallback system block)."""
        return self.tools is not None and self.use_chat_template and self.tools.native

    def render(self, turns: Sequence[Turn]) -> str:
        """The conversation as one prompt that ends where the assistant's answer begins. Empty turns are dropped,
        except tool turns when tools are bound (the tool answered nothing). Tool results render as user turns, which
        every chat template accepts: `<tool_response>` blocks in the fallback format; a template that renders tools
        gets the `tool` role."""
        native = self.native_tools
        if self.tools is not None and not native:
            turns = [(r, self.tools.render_result(c)) if r == "tool" else (r, c) for r, c in turns]
        keep = ("system", "assistant", "tool") if native else ("system", "assistant")
        turns = [(r if r in keep else "user", c) for r, c in turns]
        turns = [(r, c) for r, c in turns if c.strip() or (r == "tool" and native)] or turns[-1:]
        block = None if self.tools is None or native else self.tools.fallback_text()
        if block and turns and turns[0][0] == "system":
            turns = [("system", f"{block}\n\n{turns[0][1]}"), *turns[1:]]
        elif block:
            turns = [("system", block), *turns]
        if self.use_chat_template:
            tools = self.tools.openai_tools() if native else None
            return render_chat(self.tokenizer, [{"role": r, "content": c} for r, c in turns], tools=tools)
        if len(turns) == 1 and turns[0][0] == "user":
            return turns[0][1]
        return "\n".join(f"{r.capitalize()}: {c}" for r, c in turns) + "\nAssistant:"

    def pair(
        self, turns: Sequence[Turn], texts: Sequence[str], source: str, max_new_tokens: int, *,
        drop_in_no_context: Sequence[int] = (), question: str | None = None,
    ) -> ChatPlan:
        """Context path: the turns as given; no-context path: the same with every document text removed (and turns
        `drop_in_no_context` dropped), or with no_context_path='question' the question alone under a neutral
        instruction. Documents are trimmed (longest first) when the context path would not fit the window."""

        def render(replaced: dict[str, str]) -> tuple[str, str]:
            ctx, noctx = [], []
            for i, (role, content) in enumerate(turns):
                c, n = content, content
                for t in texts:
                    c = c.replace(t, replaced.get(t, t))
                    n = n.replace(t, "")
                ctx.append((role, c))
                if i not in drop_in_no_context:
                    noctx.append((role, n))
            return self.render(ctx), self.render(noctx)

        fitted = fit_documents(
            {t: t for t in texts}, lambda kept: render({t: k for t, k in kept.items() if k != t}), self.tokenizer,
            context_window=self.context_window, max_new_tokens=max_new_tokens, count=lambda pair: len(self.tokenizer(pair[0])["input_ids"]),
        )
        ctx, noctx = fitted.rendered
        plan = ChatPlan("prompts", source, documents=list(texts), context_prompt=ctx, no_context_prompt=noctx,
                        untrusted=[*fitted.texts.values(), *([question] if question else [])])
        for note in fitted.notes:
            logger.warning(note)
        plan.notes += fitted.notes
        plan.trimmed, plan.document_tokens = fitted.trimmed, fitted.document_tokens
        if self.no_context_path == "question":
            if question:
                plan.no_context_prompt = self.render([("user", question_only_text(question))])
            else:
                plan.fall_back("no_context_path='question' but no question was found for this call",
                               "the no-context path is the prompt with its documents removed (pass fides_question=)")
        return plan

    def plain(self, turns: Sequence[Turn], why: str, question: str | None = None, *, fallback: bool = True) -> ChatPlan:
        """No documents to contrast: 'standard' on the conversation as given, with a note saying why (a fallback,
        which a strict caller refuses, unless `fallback=False`: nothing was asked that could not be done)."""
        prompt = self.render(turns)
        plan = ChatPlan("prompts", "none", context_prompt=prompt, no_context_prompt=prompt, method="standard",
                        untrusted=[question] if question else [])
        if not fallback:
            plan.notes.append(f"{why}: decoded with 'standard' on the prompt as given")
            return plan
        return plan.fall_back(why, "decoded with 'standard' on the prompt as given")

    def with_documents(
        self, turns: Sequence[Turn], texts: Sequence[str], source: str, max_new_tokens: int, *,
        question: str | None = None, template_question: str | None = None,
    ) -> ChatPlan:
        """Plan a conversation with documents given beside it: found verbatim in it, they are contrasted where they
        stand; a single question without them gets fides-rag's template (not when tools are bound); a longer
        conversation gets them in a leading system turn (dropped on the no-context path)."""
        texts = [t for t in texts if t.strip()]
        if not texts:
            return self.plain(turns, "the documents given were empty", question)
        single = len(turns) == 1 and self.tools is None  # fides-rag's template has no place for tools
        if single and template_question:
            return ChatPlan("template", "prompt_value", question=template_question, documents=list(texts))
        if all(any(t in c for _, c in turns) for t in texts):
            return self.pair(turns, texts, source, max_new_tokens, question=question)
        if single:
            return ChatPlan("template", source, question=question or turns[0][1], documents=list(texts))
        block = self.template.document_block(texts)
        turns = [("system", f"{self.documents_instruction}\n{block}"), *turns]
        return self.pair(turns, texts, source, max_new_tokens, drop_in_no_context=(0,), question=question)

    def from_tool_turns(self, turns: Sequence[Turn], max_new_tokens: int, question: str | None = None) -> ChatPlan | None:
        """Tool results as the evidence: every non-empty tool turn's content is a document, contrasted where it
        stands (emptied on the no-context path); None when the conversation holds no tool result."""
        texts = list(dict.fromkeys(c for r, c in turns if r == "tool" and c.strip()))
        if not texts:
            return None
        return self.pair(turns, texts, "tool_messages", max_new_tokens, question=question)


class AnswerStream:
    """A streamed answer's deltas as a caller shows them: under fides-rag's template, text that may still turn out
    to be a template leftover is held back, so the deltas concatenate to `ChatPlan.finish`'s text."""

    def __init__(self, plan: ChatPlan, template: PromptTemplate) -> None:
        self.plan, self.template = plan, template
        self._leftovers = TemplateLeftovers(template) if plan.kind == "template" else None
        self._raw = self._emitted = ""

    def feed(self, delta: str) -> str:
        """The part of `delta` (with what was held back) that can be shown now."""
        if self._leftovers is None:
            return delta
        self._raw += delta
        visible = self._leftovers.visible(self._raw)
        if len(visible) > len(self._emitted) and visible.startswith(self._emitted):
            shown, self._emitted = visible[len(self._emitted) :], visible
            return shown
        return ""

    def finish(self, result: GenerationResult) -> tuple[GenerationResult, str]:
        """The cleaned result and the last delta (what was held back and belongs to the answer)."""
        result = self.plan.finish(result, self.template)
        if self._leftovers is not None and result.text.startswith(self._emitted) and len(result.text) > len(self._emitted):
            return result, result.text[len(self._emitted) :]
        return result, ""
