"""A conversation and its documents become the two prompts of dual-path decoding, in one place that every entry
point shares (LangChain's ChatFides and FidesLLM, LlamaIndex's FidesLLM, the OpenAI-compatible server), so the same
messages and documents give the same prompts, and the same answers, everywhere. One role map (`role_of`) reads every
front door's roles; one policy (`ChatPrompts.conversation`) decides where a conversation's context comes from.

The context path is the conversation as given. The no-context path is the same conversation with every document
text removed (`no_context_path="emptied"`), or the question alone under the neutral instruction ("question").
Documents that are not in the conversation yet are placed in it: a single question gets fides-rag's own template;
a longer conversation gets a leading system turn that lists them (or a framework's context system message,
`ContextMessages`). Tool results are documents too: an agent's retrieval comes back as tool turns, which form the
context path and are emptied on the no-context path.

Tools: `ChatPrompts(..., tools=ToolCalling(...))` or `prompts.with_tools(calling)` puts the tool definitions in
front of BOTH paths identically: through the chat template's `tools=` where the template renders them (tool turns
then keep their `tool` role), else as a leading system block in the fallback format (`ToolCalling.fallback_text`,
tool turns as `<tool_response>` user turns). With tools bound, an emptied tool turn stays (the tool returned nothing).
An assistant turn's earlier calls are part of its text (`ToolCalling.render_calls`), written by the caller.
"""

from __future__ import annotations

import copy
import enum
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

from fides_rag.calls.tools import ToolCalling, calls_from_openai, render_calls
from fides_rag.generation.requests import PromptPair
from fides_rag.prompts.raw import check_no_context_path, fit_documents, question_only_text, render_chat
from fides_rag.prompts.template import PromptTemplate, template_stops
from fides_rag.result import GenerationResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from fides_rag.decoder import FidesDecoder

logger = logging.getLogger("fides_rag.calls")


class _LastUserTurn(enum.Enum):
    """The type of `LAST_USER_TURN`, a default that no caller can pass by mistake."""

    LAST_USER_TURN = "the last user turn"


Turn = tuple[str, str]
"""(role, content), role one of user, assistant, system, tool."""
DOCUMENTS_INSTRUCTION = "Use the following documents to answer the question."
STANDARD = "decoded with 'standard'"
"""What a call without documents to contrast does (the second half of its note)."""
LAST_USER_TURN: Final = _LastUserTurn.LAST_USER_TURN
"""`ChatPrompts.conversation`'s default question: the last user turn's text."""
ROLE_LINE_STOPS = ("\nUser:", "\nHuman:", "\nQuestion:")
"""An answer ends where the model starts writing the next turn's role line (each starts with a newline, so an
answer is never cut to nothing)."""
TOOL_MARKUP_STOPS = ("<tool_response>",)
"""With tools bound, an answer ends where the model starts writing a tool's result itself."""
ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "chatbot": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
"""Every front door's role names (OpenAI's, LangChain's message types, LlamaIndex's MessageRole values) as the
planner's four roles; anything else is a user turn."""


def role_of(role: object) -> str:
    """A role name (or an enum whose value is one) as user, assistant, system or tool."""
    return ROLES.get(str(getattr(role, "value", role)).lower(), "user")


def turn_of(role: object, text: str, calls: Sequence[Any] = ()) -> Turn:
    """A front door's message as a planner turn: its role read by `role_of`; an assistant's earlier tool calls (OpenAI's
    shape, LangChain's or Ollama's, or ToolCalls) written after its content, as the model is asked to write them."""
    role = role_of(role)
    earlier = calls_from_openai(calls) if role == "assistant" and calls else []
    return role, render_calls(text, earlier) if earlier else text


def check_question(turns: Sequence[Turn]) -> None:
    """A ValueError unless the conversation holds a user turn: the question FIDES answers."""
    if not any(role == "user" for role, _ in turns):
        raise ValueError(
            f"the conversation has no user message (roles: {[r for r, _ in turns]}); FIDES needs a question to answer"
        )


def why_no_documents(retrieved: Sequence[str] | None, where: str) -> str:
    """Why a call has no documents to contrast, from what a retriever returned (None: no retriever ran)."""
    if retrieved is None:
        return "no documents were given (documents=) and no retriever ran in this chain run"
    if not retrieved:
        return "the retriever in this chain run returned no documents"
    return (
        f"{len(retrieved)} document(s) were retrieved in this chain run but none was found verbatim in {where} "
        f"(a formatter rewrote them, e.g. numbering or cleaning their text)"
    )


@dataclass(frozen=True)
class ContextMessages:
    """A framework's context system messages (LlamaIndex's chat engines): documents given beside a longer conversation
    go in front of its first system turn through `template` ("... {context_str} ..."), and a system turn rendered from
    one of `templates` holds its context in one of `variables`; either text is emptied on the no-context path."""

    template: str
    templates: Sequence[str] = ()
    variables: Sequence[str] = ("context_str",)
    separator: str = "\n\n"
    """Joins the documents into one context."""
    no_documents: str = "no documents= and no context system message in the chat"
    """Why a conversation without either decodes with 'standard'."""

    def placed(self, turns: Sequence[Turn], context: str) -> list[Turn]:
        """`turns` with `template` filled with `context` in front of the first system turn (or as a new one)."""
        text = self.template.replace("{context_str}", context)
        if turns and turns[0][0] == "system":
            return [("system", text + turns[0][1].strip()), *turns[1:]]
        return [("system", text), *turns]


def documents_beside(prompt: str, texts: Sequence[str]) -> bool:
    """Whether documents given with one prompt stand beside it rather than in it (none given, or not every text verbatim
    in it): fides-rag's template then takes them, the prompt being the question (`ChatPrompts.with_documents`'s
    `template_first`)."""
    return not (texts and all(t in prompt for t in texts))


def filled_variable(template: str, text: str, variables: Sequence[str]) -> tuple[str, int, int] | None:
    """Where `text`, rendered from `template` ("... {name} ..." placeholders), holds a non-blank value of one of
    `variables`: (name, start, end); None when `text` holds none (or was not rendered from `template`)."""
    pattern, last = "", 0
    for match in re.finditer(r"\{(\w+)\}", template):
        pattern += re.escape(template[last : match.start()])
        name = match.group(1)
        pattern += f"(?P<{name}>.*)" if name in variables and f"(?P<{name}>" not in pattern else "(?:.*?)"
        last = match.end()
    found = re.compile(pattern + re.escape(template[last:]), re.DOTALL).search(text)
    for name in variables:
        if found is not None and name in found.re.groupindex and found.group(name).strip():
            return name, *found.span(name)
    return None


def context_in_system(
    turns: Sequence[Turn], templates: Sequence[str], variables: Sequence[str]
) -> tuple[int, int, int] | None:
    """The first system turn rendered from one of `templates` (a framework's context system prompts) with one of
    `variables` filled in: (its index, where the context starts and ends in it); None when there is none."""
    for index, (role, content) in enumerate(turns):
        if role == "system":
            for template in templates:
                found = filled_variable(template, content, variables)
                if found is not None:
                    return index, found[1], found[2]
    return None


@dataclass
class ChatPlan:
    """How one conversation decodes: fides-rag's template (question + documents) or two rendered prompts."""

    kind: Literal["template", "prompts"]
    source: str
    """Where the documents came from: documents, prompt_value, message, retriever, system_message, tool_messages or
    none."""
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
    """Texts in the rendered prompts (the documents as kept, the question, every turn's content) that are tokenised as
    plain text."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the front door adds to the record about the prompt (a framework template's type, its context variables)."""

    @classmethod
    def as_given(
        cls,
        prompt: str,
        why: str,
        consequence: str = STANDARD,
        *,
        untrusted: Sequence[str | None] = (),
        fallback: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatPlan:
        """No documents to contrast: 'standard' on `prompt` as given, with the note `why: consequence` (a fallback,
        which
        a strict caller refuses, unless `fallback=False`: nothing was asked that could not be done)."""
        plan = cls(
            "prompts",
            "none",
            context_prompt=prompt,
            no_context_prompt=prompt,
            method="standard",
            untrusted=[t for t in untrusted if t],
            extra=dict(extra or {}),
        )
        if not fallback:
            plan.notes.append(f"{why}: {consequence}")
            return plan
        return plan.fall_back(why, consequence)

    def fall_back(self, why: str, consequence: str) -> ChatPlan:
        """Record a fallback: `why` for a strict caller's error, `why: consequence` as the note and the warning."""
        self.fallback = why
        self.notes.insert(0, f"{why}: {consequence}")
        return self

    def stop_strings(self, stop: Sequence[str], template: PromptTemplate, *, tools: bool = False) -> list[str]:
        """`stop`, plus where an answer ends whatever the prompt: a new role line ("\nUser:", "\nQuestion:": the
        model writing the next turn), a tool result's markup when tools are bound, and fides-rag's template's own
        stops when this plan decodes with that template."""
        extra = [*ROLE_LINE_STOPS, *(TOOL_MARKUP_STOPS if tools else ())]
        if self.kind == "template":
            extra += template_stops(template)
        stops = list(stop)
        return stops + [s for s in dict.fromkeys(extra) if s not in stops]

    def metadata(self, result: GenerationResult) -> dict[str, Any]:
        """The result's metadata with what the plan knows: its notes first, where the documents came from, trimming."""
        return {
            **result.to_metadata(),
            "notes": list(dict.fromkeys([*self.notes, *result.notes])),
            "documents_source": self.source,
            "num_documents": len(self.documents),
            "documents_trimmed": self.trimmed or result.documents_trimmed,
            "document_tokens": self.document_tokens or result.document_tokens,
            **self.extra,
        }

    def prompt(self) -> tuple[Any, list[str] | None]:
        """What the request builder takes: (question, documents) for the template, (PromptPair, None) otherwise."""
        if self.kind == "template":
            return self.question or "", list(self.documents)
        return PromptPair(
            self.context_prompt or "", self.no_context_prompt or "", untrusted=tuple(self.untrusted)
        ), None


class PlannerSettings(TypedDict, total=False):
    """`ChatPrompts.for_decoder`'s keywords other than `tools`, as a front door sets them once for all its calls."""

    chat: bool
    use_chat_template: bool | None
    no_context_path: str
    documents_instruction: str
    context_messages: ContextMessages | None
    render_text: Callable[[Sequence[Turn]], str] | None
    question_prompt: Callable[[str], str] | None


class ChatPrompts:
    """Renders conversations with one tokenizer's chat template (or plain `Role:` lines, or a framework's `render_text`)
    and plans their two paths."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        context_window: int,
        use_chat_template: bool,
        no_context_path: str = "emptied",
        documents_instruction: str = DOCUMENTS_INSTRUCTION,
        template: PromptTemplate | None = None,
        tools: ToolCalling | None = None,
        context_messages: ContextMessages | None = None,
        render_text: Callable[[Sequence[Turn]], str] | None = None,
        question_prompt: Callable[[str], str] | None = None,
    ) -> None:
        """`render_text`: the turns as one prompt where the chat template is not used (default: `Role:` lines);
        `question_prompt`: the no-context path's question alone under no_context_path='question' (default: one user
        turn)."""
        self.tokenizer = tokenizer
        self.context_window = context_window
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.no_context_path = check_no_context_path(no_context_path)
        self.documents_instruction = documents_instruction
        self.template = template or PromptTemplate()
        self.tools = tools
        self.context_messages = context_messages
        self.render_text = render_text
        self.question_prompt = question_prompt

    @classmethod
    def for_decoder(
        cls,
        decoder: FidesDecoder,
        *,
        chat: bool = True,
        use_chat_template: bool | None = None,
        no_context_path: str = "emptied",
        documents_instruction: str = DOCUMENTS_INSTRUCTION,
        tools: ToolCalling | None = None,
        context_messages: ContextMessages | None = None,
        render_text: Callable[[Sequence[Turn]], str] | None = None,
        question_prompt: Callable[[str], str] | None = None,
    ) -> ChatPrompts:
        """The planner of a FidesDecoder's calls: its tokenizer, window and template; the chat template for chat
        calls when the tokenizer has one (`use_chat_template=False` refuses it; a completion, `chat=False`, never
        uses it). The other keywords are the constructor's."""
        has = bool(getattr(decoder.tokenizer, "chat_template", None))
        use = chat and has and use_chat_template is not False
        return cls(
            decoder.tokenizer,
            context_window=decoder.limits.context_window,
            use_chat_template=use,
            no_context_path=no_context_path,
            documents_instruction=documents_instruction,
            template=decoder.prompts.template,
            tools=tools,
            context_messages=context_messages,
            render_text=render_text,
            question_prompt=question_prompt,
        )

    def fides_template(
        self,
        question: str,
        documents: Sequence[str],
        source: str = "documents",
        *,
        why_empty: str = "the documents given were empty",
    ) -> ChatPlan:
        """fides-rag's own template: the question and its documents (none: 'standard' on the question, a fallback
        noted as `why_empty: decoded with 'standard'`)."""
        texts = [t for t in documents if t.strip()]
        plan = ChatPlan("template", source, question=question, documents=texts)
        if not texts:
            plan.method = "standard"
            plan.fall_back(why_empty, STANDARD)
        return plan

    def with_tools(self, tools: ToolCalling | None) -> ChatPrompts:
        """The same planner with `tools` in front of both paths (None: without tools)."""
        planner = copy.copy(self)
        planner.tools = tools
        return planner

    @property
    def native_tools(self) -> bool:
        """Tools are rendered by the chat template (else by the fallback system block)."""
        return self.renders_tools(self.tools)

    def renders_tools(self, tools: ToolCalling | None) -> bool:
        """Whether this planner with `tools` bound has the chat template render them (`Call`'s `native_tools`, the
        record's tool_format "native"); False without tools, or where they go in the fallback system block."""
        return tools is not None and self.use_chat_template and tools.native

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
            offered = self.tools if native and self.tools is not None and self.tools.arguments_only is None else None
            tools = None if offered is None else offered.openai_tools()  # a call's bare arguments: no tools shown
            return render_chat(self.tokenizer, [{"role": r, "content": c} for r, c in turns], tools=tools)
        if self.render_text is not None:
            return self.render_text(turns)
        if len(turns) == 1 and turns[0][0] == "user":
            return turns[0][1]
        return "\n".join(f"{r.capitalize()}: {c}" for r, c in turns) + "\nAssistant:"

    def pair(
        self,
        turns: Sequence[Turn],
        texts: Sequence[str],
        source: str,
        max_new_tokens: int,
        *,
        drop_in_no_context: Sequence[int] = (),
        question: str | None = None,
    ) -> ChatPlan:
        """Context path: the turns as given; no-context path: the same with every document text removed (and turns
        `drop_in_no_context` dropped), or with no_context_path='question' the question alone under a neutral
        instruction. Documents are trimmed (longest first) when the context path would not fit the window."""

        def render(replaced: dict[str, str]) -> tuple[str, str]:
            ctx, noctx = [], []
            for i, (role, content) in enumerate(turns):
                ctx.append((role, _replace_all(content, {t: replaced.get(t, t) for t in texts})))
                if i not in drop_in_no_context:
                    noctx.append((role, _replace_all(content, dict.fromkeys(texts, ""))))
            return self.render(ctx), self.render(noctx)

        fitted = fit_documents(
            {t: t for t in texts},
            lambda kept: render({t: k for t, k in kept.items() if k != t}),
            self.tokenizer,
            context_window=self.context_window,
            max_new_tokens=max_new_tokens,
            count=lambda pair: len(self.tokenizer(pair[0])["input_ids"]),
        )
        ctx, noctx = fitted.rendered
        kept = [(r, _replace_all(c, fitted.texts)) for r, c in turns]
        emptied = [(r, _replace_all(c, dict.fromkeys(texts, ""))) for r, c in turns]
        plan = ChatPlan(
            "prompts",
            source,
            documents=[fitted.texts[t] for t in texts],
            context_prompt=ctx,
            no_context_prompt=noctx,
            untrusted=_untrusted([*fitted.texts.values(), *([question] if question else [])], kept, emptied),
        )
        for note in fitted.notes:
            logger.warning(note)
        plan.notes += fitted.notes
        plan.trimmed, plan.document_tokens = fitted.trimmed, fitted.document_tokens
        return self._question_path(plan, question)

    def template_pair(
        self,
        render: Callable[[dict[str, str]], str],
        context: Mapping[str, str],
        max_new_tokens: int,
        *,
        source: str = "context",
        question: str | None = None,
        untrusted: Sequence[str | None] = (),
        question_prompt: Callable[[str], str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatPlan:
        """A prompt template rendered with and without its context variables. `render` fills the variables named in
        `context` (and nothing else changes). Context path: `render(context)`, the longest value trimmed while the
        prompt and `max_new_tokens` do not fit the window; no-context path: every variable emptied, or under
        no_context_path='question' the question alone (rendered by `question_prompt`, default: one user turn).
        `untrusted`: the prompt's other texts (the question, the messages), tokenised as plain text."""
        fitted = fit_documents(
            dict(context), render, self.tokenizer, context_window=self.context_window, max_new_tokens=max_new_tokens
        )
        for note in fitted.notes:
            logger.warning(note)
        kept = [t for t in fitted.texts.values() if t.strip()]
        plan = ChatPlan(
            "prompts",
            source,
            documents=kept,
            context_prompt=fitted.rendered,
            no_context_prompt=render(dict.fromkeys(context, "")),
            notes=list(fitted.notes),
            trimmed=fitted.trimmed,
            document_tokens=fitted.document_tokens,
            untrusted=[t for t in dict.fromkeys([*kept, *untrusted]) if t],
            extra=dict(extra or {}),
        )
        return self._question_path(plan, question, question_prompt)

    def variables_pair(
        self,
        render: Callable[[dict[str, str]], str],
        context: Mapping[str, str],
        max_new_tokens: int,
        *,
        variables: Sequence[str],
        separator: str = "\n\n",
        question: str | None = None,
        untrusted: Sequence[str | None] = (),
        question_prompt: Callable[[str], str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatPlan:
        """A framework's prompt template whose retrieved text travels in `variables`; `context`: those the call fills,
        as text. Where one holds text, `template_pair` (the record's `context`: the kept texts joined by `separator`);
        else 'standard' on the prompt as rendered, a fallback: the variable was empty, or is not in the prompt.
        `untrusted`: the prompt's texts beside the question (the messages), tokenised as plain text."""
        untrusted = [question, *untrusted]
        if not any(v.strip() for v in context.values()):
            why = f"the context variable ({', '.join(variables)}) {'was empty' if context else 'is not in the prompt'}"
            return ChatPlan.as_given(render(dict(context)), why, untrusted=untrusted, extra=extra)
        plan = self.template_pair(
            render,
            context,
            max_new_tokens,
            question=question,
            untrusted=untrusted,
            question_prompt=question_prompt,
            extra=extra,
        )
        plan.extra["context"] = separator.join(plan.documents)
        return plan

    def _question_path(
        self, plan: ChatPlan, question: str | None, question_prompt: Callable[[str], str] | None = None
    ) -> ChatPlan:
        """Under no_context_path='question', the plan's no-context path becomes the question alone under the neutral
        instruction (a fallback to the emptied prompt where no question was found)."""
        if self.no_context_path != "question":
            return plan
        if question and question.strip():
            text = question_only_text(question)
            question_prompt = question_prompt or self.question_prompt
            plan.no_context_prompt = (
                question_prompt(text) if question_prompt is not None else self.render([("user", text)])
            )
            return plan
        return plan.fall_back(
            "no_context_path='question' but no question was found for this call",
            "the no-context path is the prompt with its documents removed (pass the question)",
        )

    def plain(self, turns: Sequence[Turn], why: str, question: str | None = None, *, fallback: bool = True) -> ChatPlan:
        """No documents to contrast: 'standard' on the conversation as given, with a note saying why (a fallback,
        which a strict caller refuses, unless `fallback=False`: nothing was asked that could not be done)."""
        return ChatPlan.as_given(
            self.render(turns),
            why,
            "decoded with 'standard' on the prompt as given",
            untrusted=_untrusted([question] if question else [], turns),
            fallback=fallback,
        )

    def with_documents(
        self,
        turns: Sequence[Turn],
        texts: Sequence[str],
        source: str,
        max_new_tokens: int,
        *,
        question: str | None = None,
        template_question: str | None = None,
        template_first: bool = False,
    ) -> ChatPlan:
        """Plan a conversation with documents given beside it: found verbatim in it, they are contrasted where they
        stand; a single question without them gets fides-rag's template (not when tools are bound); a longer
        conversation gets them in a leading system turn (dropped on the no-context path), or in the `context_messages`
        template's system message (its context emptied there).

        `template_question`: the template's question of a single turn that renders it (a prompt value's; the source is
        then "prompt_value"), used when there are documents. `template_first` (one prompt with documents beside it, as
        a completion LLM takes them): the template whenever a question is asked or the documents are not all in the
        prompt, empty documents included ('standard' on the question, noted), with `source` as the source."""
        # fides-rag's template has no place for tools; a call forced to one tool shows none (`arguments_only`)
        single = len(turns) == 1 and (self.tools is None or self.tools.arguments_only is not None)
        if template_first and single and (template_question is not None or documents_beside(turns[0][1], texts)):
            return self.fides_template(turns[0][1] if template_question is None else template_question, texts, source)
        if self.context_messages is not None and not single:
            context = self.context_messages.separator.join(texts)
            if not context.strip():
                return ChatPlan.as_given(
                    self.render(turns), "the documents given were empty", untrusted=[question, *(c for _, c in turns)]
                )
            return self._in_context(self.context_messages.placed(turns, context), context, max_new_tokens, question)
        texts = [t for t in texts if t.strip()]
        if not texts:
            return self.plain(turns, "the documents given were empty", question)
        if single and template_question:
            return ChatPlan("template", "prompt_value", question=template_question, documents=list(texts))
        if all(any(t in c for _, c in turns) for t in texts):
            return self.pair(turns, texts, source, max_new_tokens, question=question)
        if single:
            return ChatPlan("template", source, question=question or turns[0][1], documents=list(texts))
        block = self.template.document_block(texts)
        turns = [("system", f"{self.documents_instruction}\n{block}"), *turns]
        return self.pair(turns, texts, source, max_new_tokens, drop_in_no_context=(0,), question=question)

    def from_tool_turns(
        self, turns: Sequence[Turn], max_new_tokens: int, question: str | None = None
    ) -> ChatPlan | None:
        """Tool results as the evidence: every non-empty tool turn's content is a document, contrasted where it
        stands (emptied on the no-context path); None when the conversation holds no tool result."""
        texts = list(dict.fromkeys(c for r, c in turns if r == "tool" and c.strip()))
        if not texts:
            return None
        return self.pair(turns, texts, "tool_messages", max_new_tokens, question=question)

    def conversation(
        self,
        turns: Sequence[Turn],
        max_new_tokens: int,
        *,
        documents: Sequence[str] | None = None,
        source: str = "documents",
        template_question: str | None = None,
        template_first: bool = False,
        found: Sequence[str] = (),
        retrieved: Sequence[str] | None = None,
        system_as_context: bool = True,
        question: str | None | _LastUserTurn = LAST_USER_TURN,
        where: str = "the messages",
    ) -> ChatPlan:
        """Where a conversation's context comes from, first that applies: `documents` given beside it; the tool turns'
        results; `found` (retrieved texts found verbatim in it; `retrieved`: all a retriever returned, None when none
        ran); a system turn rendered from a `context_messages` template (without one: none); the system turns
        (`system_as_context`); else none ('standard', noted). An agent's first turn (tools bound, nothing retrieved) is
        'standard' without a fallback: its evidence comes back as tool turns. `question`: the no-context path's under
        no_context_path='question' (default: the last user turn; None: unknown); `template_question`, `template_first`:
        as `with_documents` takes them."""
        check_question(turns)
        if question is LAST_USER_TURN:
            question = next(c for r, c in reversed(turns) if r == "user")
        if documents is not None:
            return self.with_documents(
                turns,
                documents,
                source,
                max_new_tokens,
                question=question,
                template_question=template_question,
                template_first=template_first,
            )
        from_tools = self.from_tool_turns(turns, max_new_tokens, question=question)
        if from_tools is not None:
            return from_tools
        if found:
            plan = self.pair(turns, list(found), "retriever", max_new_tokens, question=question)
            missing = len({t for t in retrieved or [] if t.strip()} - set(found))
            if missing:
                note = (
                    f"{missing} of the {missing + len(found)} documents retrieved in this run were not found "
                    "verbatim in "
                    f"{where} (rewritten by a formatter?); their text, if any, stays in both paths"
                )
                logger.warning(note)
                plan.notes.append(note)
            return plan
        if self.context_messages is not None:  # a system turn rendered from one of the framework's context templates
            span = context_in_system(turns, self.context_messages.templates, self.context_messages.variables)
            if span is None:
                return ChatPlan.as_given(
                    self.render(turns), self.context_messages.no_documents, untrusted=[question, *(c for _, c in turns)]
                )
            return self._in_context(turns, turns[span[0]][1][span[1] : span[2]], max_new_tokens, question)
        systems = [i for i, (r, c) in enumerate(turns) if r == "system" and c.strip()]
        if retrieved is not None and not retrieved:  # an empty retrieval: a system turn holds only its instruction
            return self.plain(turns, why_no_documents(retrieved, where), question)
        if system_as_context and systems:
            plan = self.pair(
                turns,
                [turns[i][1] for i in systems],
                "system_message",
                max_new_tokens,
                drop_in_no_context=systems,
                question=question,
            )
            if retrieved:
                return plan.fall_back(
                    why_no_documents(retrieved, where),
                    "took the whole system message(s) as the context instead (system_message_as_context=True)",
                )
            note = (
                "no documents were given, attached or retrieved: the system message(s) were taken as the "
                "context (system_message_as_context=True)"
            )
            logger.info(note)
            plan.notes.insert(0, note)
            return plan
        if self.tools is not None and not retrieved:
            return self.plain(turns, "tools are bound and no tool has answered yet", question, fallback=False)
        return self.plain(turns, why_no_documents(retrieved, where), question)

    def _in_context(self, turns: Sequence[Turn], context: str, max_new_tokens: int, question: str | None) -> ChatPlan:
        """`context`, one text in `turns`, contrasted where it stands (the record's `context`: as kept)."""
        plan = self.pair(turns, [context], "context", max_new_tokens, question=question)
        plan.extra["context"] = plan.documents[0]
        return plan


def _replace_all(content: str, replaced: dict[str, str]) -> str:
    for text, by in replaced.items():
        content = content.replace(text, by)
    return content


def _untrusted(texts: Sequence[str], *conversations: Sequence[Turn]) -> list[str]:
    """`texts` and every turn's content, whatever its role: all of it is tokenised as plain text, so markup typed
    into any turn stays text and only the chat template's own tokens are control tokens."""
    return list(dict.fromkeys([*texts, *(c for turns in conversations for _, c in turns if c.strip())]))
