"""Prompt preparation: the context and no-context prompts of an example (template or raw), trimming of
documents that would not fit the context window, and one prompt per document for per-document paths."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from fides_rag.errors import ContextWindowExceeded, EmptyQuestion
from fides_rag.generation.plain_text import PlainTextEncoder, Span, find_spans
from fides_rag.prompts.template import PromptTemplate, document_texts, fit_texts, template_stops

logger = logging.getLogger(__name__)

MAX_SANE_CONTEXT = 10_000_000


@dataclass
class PreparedExample:
    """The tokenised prompts of one example, and how they came to be."""

    context_prompt: str
    no_context_prompt: str
    context_ids: list[int]
    no_context_ids: list[int]
    stop: tuple[str, ...]
    has_documents: bool
    notes: list[str] = field(default_factory=list)
    documents_trimmed: bool = False
    document_tokens: tuple[int, int] | None = None
    document_prompts: list[str] | None = None
    """One prompt per document [d_n; x] (the context template with that document alone), for rules with a
    per-document path; None when they were not asked for (or cannot exist: raw prompts)."""
    document_ids: list[list[int]] | None = None
    template_prefixes: tuple[list[int], ...] = ()
    """The ids every prompt of this example's template starts with (context and no-context), where the prefill
    cuts its prompts so that other requests can reuse the states (the prefix cache)."""
    template: PromptTemplate | None = None
    """fides-rag's template the prompts were rendered with, whose leftovers are cut from the answer (None: prompts
    given as they are)."""


def context_window(model_config: Any, tokenizer: PreTrainedTokenizerBase) -> int:
    """The smaller of the model's position limit and the tokenizer's max length (ignoring sentinel values)."""
    candidates = [getattr(model_config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    sane = [int(c) for c in candidates if isinstance(c, int) and 0 < c < MAX_SANE_CONTEXT]
    return min(sane) if sane else MAX_SANE_CONTEXT


def check_text(value: str, name: str) -> None:
    """Refuse text the tokenizer cannot encode (a lone surrogate), naming the argument and the position."""
    for position, char in enumerate(value):
        if "\ud800" <= char <= "\udfff":
            raise ValueError(
                f"{name} holds a lone surrogate character {char!r} at position {position}, which is not valid "
                f"Unicode and cannot be tokenised; fix the text's encoding (e.g. decode bytes with errors='replace')"
            )


class PromptPreparer:
    """Renders and tokenises examples with one template, tokenizer and context window.

    The question and the documents are tokenised as plain text: special-token text inside them (a document holding
    "<|im_end|>") never becomes a control token. Prompts whose question and documents hold none are tokenised as the
    whole rendered string always was."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, template: PromptTemplate, use_chat_template: bool, window: int
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.use_chat_template = use_chat_template
        self.context_window = window
        self.plain_text = PlainTextEncoder(tokenizer)
        self._prefixes: tuple[list[int], ...] | None = None

    @property
    def template_prefixes(self) -> tuple[list[int], ...]:
        """The fixed ids the template's context prompts start with, and its no-context prompts': the common part of
        prompts rendered for two unlike questions and documents."""
        if self._prefixes is None:
            pairs = [
                (self.render(q, d)[1] for q, d in (("Why one?", doc_a), ("Who two?", doc_b)))
                for doc_a, doc_b in (
                    (self.template.document_block(["Alpha."]), self.template.document_block(["Beta."])),
                    (None, None),
                )
            ]
            self._prefixes = tuple(a[: common_prefix(a, b)] for a, b in pairs)
        return self._prefixes

    def encode(self, text: str, templated: bool) -> list[int]:
        # A chat template already wrote any BOS token into the text.
        return self.tokenizer(text, add_special_tokens=not templated)["input_ids"]

    def render(self, question: str, document_block: str | None) -> tuple[str, list[int]]:
        """The template's prompt for `question` over `document_block` (None: the no-context prompt), and its ids."""
        text = self.template.render(self.tokenizer, question, document_block, self.use_chat_template)
        untrusted = [question] if document_block is None else [question, document_block]
        if not any(self.plain_text.holds_control_text(t) for t in untrusted):
            return text, self.encode(text, templated=self.use_chat_template)
        spans = self._user_spans(question, document_block, text)
        return text, self.plain_text.encode(text, spans, add_special_tokens=not self.use_chat_template)

    def _user_spans(self, question: str, document_block: str | None, text: str) -> list[Span]:
        """Where the question and the document block sit in the rendered `text`: rendered again with placeholders
        (so a document equal to the template's own markup is not mistaken for it), else found verbatim."""
        values = {"\ue000question\ue000": question, "\ue000documents\ue000": document_block}
        marked = self.template.render(
            self.tokenizer,
            "\ue000question\ue000",
            None if document_block is None else "\ue000documents\ue000",
            self.use_chat_template,
        )
        rebuilt, spans = "", []
        for part in re.split("(\ue000(?:question|documents)\ue000)", marked):
            if part in values:
                part = values[part] or ""
                spans.append((len(rebuilt), len(rebuilt) + len(part)))
            rebuilt += part
        return spans if rebuilt == text else find_spans([v for v in values.values() if v is not None], text)

    def render_fitted(
        self, question: str, texts: Sequence[str], max_new_tokens: int
    ) -> tuple[str, list[int], tuple[int, int] | None]:
        """The context prompt over `texts`, its ids, and (block tokens given, kept) when the document block had
        to be cut at its end so that the prompt plus max_new_tokens fits the context window."""
        fitted = fit_texts(
            {"documents": self.template.document_block(texts)},
            lambda kept: self.render(question, kept["documents"]),
            lambda rendered: len(rendered[1]),
            self.context_window - max_new_tokens,
            self.tokenizer,
            max_new_tokens=max_new_tokens,
        )
        prompt, ids = fitted.rendered
        return prompt, ids, (fitted.tokens_before, fitted.tokens_after) if fitted.trimmed else None

    def _note(self, example: PreparedExample, what: str, max_new_tokens: int) -> None:
        note = (
            f"{what} so that the prompt plus max_new_tokens={max_new_tokens} fits the context window of "
            f"{self.context_window}"
        )
        logger.warning(note)
        example.notes.append(note)

    def prepare(
        self, question: str, documents: Any, max_new_tokens: int, *, document_paths: bool = False
    ) -> PreparedExample:
        """Render and tokenise both branches of one example, trimming documents that would not fit.

        With `document_paths`, also one prompt per document, each trimmed on its own in the same way."""
        if not isinstance(question, str) or not question.strip():
            raise EmptyQuestion(f"question must be a non-empty string, got {question!r}")
        check_text(question, "question")
        question = question.strip()
        texts = document_texts(documents)
        for number, text in enumerate(texts, 1):
            check_text(text, f"document {number}")
        budget = self.context_window - max_new_tokens
        no_ctx_prompt, no_ctx_ids = self.render(question, None)
        if len(no_ctx_ids) > budget:
            raise ContextWindowExceeded(
                len(no_ctx_ids),
                max_new_tokens,
                self.context_window,
                message=f"the question alone takes {len(no_ctx_ids)} prompt tokens, more than the context window "
                f"({self.context_window}) minus max_new_tokens ({max_new_tokens}); shorten it or lower max_new_tokens",
            )
        # Plain text stops at the template's stops (a newline); a chat turn ends at EOS, but an answer that
        # runs on into the template's next line ("\nDocument [2]: ...") stops there too.
        stop = template_stops(self.template) if self.use_chat_template else tuple(self.template.stop)
        if not texts:
            note = "no documents were given: decoded with 'standard' on the question alone"
            logger.warning(note)
            return PreparedExample(
                no_ctx_prompt,
                no_ctx_prompt,
                no_ctx_ids,
                no_ctx_ids,
                stop,
                False,
                [note],
                template_prefixes=self.template_prefixes,
                template=self.template,
            )

        ctx_prompt, ctx_ids, trimmed = self.render_fitted(question, texts, max_new_tokens)
        example = PreparedExample(
            ctx_prompt,
            no_ctx_prompt,
            ctx_ids,
            no_ctx_ids,
            stop,
            True,
            template_prefixes=self.template_prefixes,
            template=self.template,
        )
        if trimmed is not None:
            self._note(example, f"documents trimmed from {trimmed[0]} to {trimmed[1]} tokens", max_new_tokens)
            example.documents_trimmed = True
            example.document_tokens = trimmed
        if document_paths:
            example.document_prompts, example.document_ids = [], []
            for number, text in enumerate(texts, 1):
                prompt, ids, cut = self.render_fitted(question, [text], max_new_tokens)
                example.document_prompts.append(prompt)
                example.document_ids.append(ids)
                if cut is not None:
                    self._note(
                        example,
                        f"document {number}'s own prompt trimmed from {cut[0]} to {cut[1]} tokens",
                        max_new_tokens,
                    )
        return example

    def prepare_from_prompts(
        self,
        context_prompt: str,
        no_context_prompt: str,
        max_new_tokens: int,
        add_special_tokens: bool = True,
        *,
        untrusted: Sequence[str] | str = (),
    ) -> PreparedExample:
        """Tokenise two raw prompts as the tokenizer does by default (no template, no trimming).

        Pass add_special_tokens=False for text that already holds them, e.g. from `apply_chat_template`.
        `untrusted`: texts that occur verbatim in the prompts (the documents, the question), tokenised as plain text
        wherever they occur (a text found nowhere changes nothing); the rest (e.g. a chat template's markup) as
        given."""
        for name, prompt in (("context_prompt", context_prompt), ("no_context_prompt", no_context_prompt)):
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{name} must be a non-empty string, got {prompt!r}")
            check_text(prompt, name)
        ctx_ids, no_ctx_ids = self._encode_raw((context_prompt, no_context_prompt), add_special_tokens, untrusted)
        longest = max(len(ctx_ids), len(no_ctx_ids))
        if longest + max_new_tokens > self.context_window:
            raise ContextWindowExceeded(longest, max_new_tokens, self.context_window)
        return PreparedExample(context_prompt, no_context_prompt, ctx_ids, no_ctx_ids, (), True)

    def _encode_raw(
        self, prompts: Sequence[str], add_special_tokens: bool, untrusted: Sequence[str] | str
    ) -> list[list[int]]:
        texts = [untrusted] if isinstance(untrusted, str) else list(untrusted)
        if any(not isinstance(t, str) for t in texts):
            raise ValueError(
                f"untrusted must be a list of strings (texts that occur in the prompts), got {untrusted!r:.200}"
            )
        risky = [t for t in texts if t.strip() and self.plain_text.holds_control_text(t)]
        if not risky:
            return [self.tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
        return [
            self.plain_text.encode(p, find_spans(risky, p), add_special_tokens) for p in prompts
        ]  # a clean text holds no control token


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
