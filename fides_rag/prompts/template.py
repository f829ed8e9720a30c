"""The two prompts of dual-path decoding: the 2-shot template of GUIDE §1, as plain text or chat turns.

Only the instruction line (and the documents) differ between the branches, so any difference
between the paths' predictions comes from the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fides_rag.errors import ContextWindowExceeded


@dataclass(frozen=True)
class Demonstration:
    """One worked example shown before the question."""

    question: str
    answer: str
    documents: tuple[str, ...]


DEFAULT_DEMONSTRATIONS: tuple[Demonstration, ...] = (
    Demonstration(
        question="What is the highest mountain in Africa?",
        answer="Mount Kilimanjaro",
        documents=(
            "Mount Kilimanjaro is a dormant volcano in Tanzania. Rising 5,895 metres above sea level, "
            "it is the highest mountain in Africa and the highest free-standing mountain in the world.",
        ),
    ),
    Demonstration(
        question="Who wrote the novel Things Fall Apart?",
        answer="Chinua Achebe",
        documents=(
            "Things Fall Apart is the debut novel of the Nigerian author Chinua Achebe, first published in 1958. "
            "It follows Okonkwo, a leader and wrestling champion in the fictional Igbo village of Umuofia.",
        ),
    ),
)


def document_text(document: Any) -> str:
    """The text of one document: a str, or an object with `page_content` (LangChain) or `text` (LlamaIndex)."""
    if isinstance(document, str):
        return document
    for attribute in ("page_content", "text"):
        value = getattr(document, attribute, None)
        if isinstance(value, str):
            return value
    raise TypeError(
        f"unsupported document type {type(document).__name__}: pass strings, or objects with a "
        f"`page_content` (LangChain Document) or `text` (LlamaIndex node) string attribute"
    )


def document_texts(documents: Sequence[Any] | str | None) -> list[str]:
    """Normalise a document argument to a list of non-empty strings (a bare string is one document).

    A mapping is refused: iterating it would take its keys for documents."""
    if documents is None:
        return []
    if isinstance(documents, Mapping):
        raise TypeError(
            f"documents is a mapping ({type(documents).__name__} with keys {list(documents)[:5]!r}), which would "
            "be read as its "
            f"keys; pass a list of documents, e.g. [d['text']] or [d['text'] for d in records]"
        )
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        if isinstance(documents, str):
            documents = [documents]
        elif hasattr(documents, "__iter__"):
            documents = list(documents)
        else:
            documents = [documents]
    texts = [document_text(d) for d in documents]
    return [t for t in texts if t.strip()]


def context_text(value: Any, separator: str = "\n\n") -> str:
    """A template variable's context as one text: a string as given (None: ""), else its documents' texts (one
    document or a list of them: strings, or objects with `.text` or `.page_content`) joined by `separator`."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    documents = list(value) if isinstance(value, (list, tuple)) else [value]
    return separator.join(document_texts(documents))


@dataclass(frozen=True)
class PromptTemplate:
    """The 2-shot QA template of both branches. Replace any field, or subclass and override the turn builders."""

    context_instruction: str = "Using only the references listed above, answer the following question:"
    no_context_instruction: str = "Answer the following question:"
    demonstrations: tuple[Demonstration, ...] = DEFAULT_DEMONSTRATIONS
    document_format: str = "Document [{index}]: {text}"
    question_format: str = "Question: {question}"
    answer_prefix: str = "Answer:"
    stop: tuple[str, ...] = field(default=("\n",))
    """Stop strings for plain-text prompts (a base model would go on to invent the next question)."""

    def document_block(self, documents: Sequence[str]) -> str:
        return "\n".join(self.document_format.format(index=i, text=text.strip()) for i, text in enumerate(documents, 1))

    def context_turn(self, question: str, document_block: str) -> str:
        return f"{document_block}\n{self.context_instruction}\n{self.question_format.format(question=question)}"

    def no_context_turn(self, question: str) -> str:
        return f"{self.no_context_instruction}\n{self.question_format.format(question=question)}"

    def _turns(self, question: str, document_block: str | None) -> list[tuple[str, str | None]]:
        turns: list[tuple[str, str | None]] = []
        for demo in self.demonstrations:
            if document_block is None:
                turns.append((self.no_context_turn(demo.question), demo.answer))
            else:
                turns.append((self.context_turn(demo.question, self.document_block(demo.documents)), demo.answer))
        last = self.no_context_turn(question) if document_block is None else self.context_turn(question, document_block)
        turns.append((last, None))
        return turns

    def render_text(self, question: str, document_block: str | None) -> str:
        """Plain-text prompt; `document_block=None` renders the no-context branch."""
        parts = []
        for user, answer in self._turns(question, document_block):
            parts.append(f"{user}\n{self.answer_prefix}" + (f" {answer}" if answer is not None else ""))
        return "\n\n".join(parts)

    def render_messages(self, question: str, document_block: str | None) -> list[dict[str, str]]:
        """Chat turns (demonstrations as earlier exchanges); `document_block=None` renders the no-context branch."""
        messages: list[dict[str, str]] = []
        for user, answer in self._turns(question, document_block):
            messages.append({"role": "user", "content": user})
            if answer is not None:
                messages.append({"role": "assistant", "content": answer})
        return messages

    def render(self, tokenizer: Any, question: str, document_block: str | None, use_chat_template: bool) -> str:
        """The prompt string for one branch, through the tokenizer's chat template when asked."""
        if not use_chat_template:
            return self.render_text(question, document_block)
        return tokenizer.apply_chat_template(
            self.render_messages(question, document_block), tokenize=False, add_generation_prompt=True
        )


Rendered = TypeVar("Rendered")


@dataclass
class FittedTexts(Generic[Rendered]):
    """What `fit_texts` kept: the rendered prompt, the (possibly cut) texts, and their token counts."""

    rendered: Rendered
    texts: dict[str, str]
    tokens_before: int
    tokens_after: int

    @property
    def trimmed(self) -> bool:
        return self.tokens_after < self.tokens_before

    def note(self, max_new_tokens: int, context_window: int) -> str:
        return (
            f"documents trimmed from {self.tokens_before} to {self.tokens_after} tokens so that the prompt plus "
            f"max_new_tokens={max_new_tokens} fits the context window of {context_window}"
        )


def fit_texts(
    texts: Mapping[str, str],
    render: Callable[[dict[str, str]], Rendered],
    count: Callable[[Rendered], int],
    budget: int,
    tokenizer: Any,
    *,
    max_new_tokens: int = 0,
) -> FittedTexts[Rendered]:
    """Render a prompt from named texts (documents); while it is over `budget` tokens, cut the longest
    text's tail by the overflow. One rule for the decoder's template and the integrations' own prompts.

    `render` builds the prompt from the current texts, `count` gives its length in tokens. Raises
    ContextWindowExceeded (a ValueError) when the prompt does not fit even with every text emptied, with the
    prompt's tokens then and `max_new_tokens` (the part of the context window that `budget` leaves out).
    """
    current = dict(texts)
    ids = {name: tokenizer(text, add_special_tokens=False)["input_ids"] for name, text in current.items()}
    kept = {name: len(i) for name, i in ids.items()}
    before = sum(kept.values())
    rendered = render(current)
    over = count(rendered) - budget
    while over > 0:
        longest = max(kept, key=kept.__getitem__, default=None)
        if longest is None or kept[longest] == 0:
            raise ContextWindowExceeded(
                budget + over,
                max_new_tokens,
                budget + max_new_tokens,
                message=f"the prompt does not fit even without its documents: {over} tokens over the budget of "
                f"{budget} "
                f"(the context window minus max_new_tokens); shorten the question or prompt, or lower max_new_tokens",
            )
        kept[longest] = max(0, kept[longest] - over)
        current[longest] = tokenizer.decode(ids[longest][: kept[longest]], skip_special_tokens=True)
        rendered = render(current)
        over = count(rendered) - budget
    return FittedTexts(rendered, current, before, sum(kept.values()))


# -- template leftovers in answers ---------------------------------------------------------------


def template_stops(template: PromptTemplate) -> tuple[str, ...]:
    """Stop strings that end an answer where the model starts writing the template's next line.

    After answering, a model sometimes copies the template on ("Rome.\\nDocument [3]: ...",
    "\\nUsing only the references ..."). Plain-text prompts already stop at a newline; these also
    hold under a chat template. Each starts with a newline, so an answer is never cut to nothing.
    """
    heads = [fmt.split("{", 1)[0].strip() for fmt in (template.document_format, template.question_format)]
    lines = [*heads, template.context_instruction.strip(), template.no_context_instruction.strip()]
    return tuple(dict.fromkeys(f"\n{line}" for line in lines if line))


class TemplateLeftovers:
    """Removes what an answer copied from fides-rag's template: a leading document label such as
    "Document [2]:" (contrastive decoding pushes a model towards the documents' own first tokens), and
    at a truncated end, the start of a template line that `template_stops` would have stopped at.

    `clean(text)` is for a finished answer; `visible(text)` is the part of a growing answer that is
    safe to stream (a possible label at the start, or a possible stop at the end, is held back).
    """

    def __init__(self, template: PromptTemplate) -> None:
        self.stops = template_stops(template)
        head = template.document_format.split("{text}", 1)[0]
        before, index, after = head.partition("{index}")
        self._label: tuple[str, str] | None = None
        if index and "{" not in before + after and before.strip():
            self._label = (before.lstrip(), after.strip())

    def _lead(self, text: str) -> tuple[str, int | None]:
        """("match", end) / ("maybe", None) / ("no", None) for a document label at the start of `text`."""
        if self._label is None:
            return "no", None
        before, after = self._label
        start = len(text) - len(text.lstrip())
        s = text[start:]
        if len(s) < len(before):
            return ("maybe" if before.startswith(s) else "no"), None
        if not s.startswith(before):
            return "no", None
        i = len(before)
        digits = i
        while digits < len(s) and s[digits].isdigit():
            digits += 1
        if digits == i:
            return ("maybe" if digits == len(s) else "no"), None
        rest = s[digits:]
        if rest.startswith(after):
            end = start + digits + len(after)
            return "match", end + (len(text[end:]) - len(text[end:].lstrip()))
        return ("maybe" if after.startswith(rest) else "no"), None

    def _partial_stop(self, text: str) -> int:
        """Length of the longest suffix of `text` that is the start of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-n:]):
                    best = n
                    break
        return best

    def clean(self, text: str, *, truncated: bool = False) -> tuple[str, list[str]]:
        """The answer without leftovers, and a note for each removal. `truncated`: it ended at the token limit."""
        notes = []
        state, end = self._lead(text)
        if state == "maybe" and truncated and text.strip():
            return "", [f"removed the template leftover {text.strip()!r}, all the truncated answer held"]
        if state == "match":
            notes.append(f"removed the template leftover {text[:end].strip()!r} from the start of the answer")
            text = text[end:]
        cut = self._partial_stop(text) if truncated else 0
        if cut:
            notes.append(f"removed the start of a template line {text[-cut:]!r} from the end of the truncated answer")
            text = text[:-cut]
        return text.strip(), notes

    def visible(self, text: str) -> str:
        """The part of a growing answer that can be streamed now."""
        state, end = self._lead(text)
        if state == "maybe":
            return ""
        if state == "match":
            text = text[end:]
        cut = self._partial_stop(text)
        return (text[:-cut] if cut else text).strip()
