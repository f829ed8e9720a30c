"""Untrusted text (questions, retrieved documents) tokenised as plain text: a string such as "<|im_end|>" inside
it never becomes a control token; only the prompt's own markup (a chat template's turns, BOS) does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Span = tuple[int, int]


def find_spans(texts: Sequence[str], prompt: str) -> list[Span]:
    """Every (start, end) where one of `texts` (stripped, non-empty) occurs verbatim in `prompt`."""
    spans = []
    for text in texts:
        text = text.strip()
        start = prompt.find(text) if text else -1
        while start >= 0:
            spans.append((start, start + len(text)))
            start = prompt.find(text, start + 1)
    return spans


def _overlaps(start: int, end: int, spans: Sequence[Span]) -> bool:
    return start < end and any(start < b and a < end for a, b in spans)


class PlainTextEncoder:
    """Tokenises a prompt so that the control tokens inside given spans of untrusted text are split into plain text.

    Control tokens are the tokenizer's special added tokens. A prompt whose spans hold none is tokenised exactly as
    `tokenizer(prompt)`; otherwise only the stretches between two of the prompt's own control tokens that hold an
    injected one are tokenised again, with special tokens split (transformers' `split_special_tokens`)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.control_ids = frozenset(
            {i for i, token in added.items() if getattr(token, "special", False)}
            | set(getattr(tokenizer, "all_special_ids", ()) or ())
        )
        self._first_chars = frozenset(t[:1] for t in tokenizer.convert_ids_to_tokens(sorted(self.control_ids)) if t)
        self._splitting: Any = None

    def holds_control_text(self, text: str) -> bool:
        """Whether `text`, tokenised on its own, yields a control token (it holds e.g. "<|im_start|>")."""
        if not any(c in text for c in self._first_chars):  # no control token can start anywhere in it
            return False
        return any(i in self.control_ids for i in self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, prompt: str, spans: Sequence[Span], add_special_tokens: bool) -> list[int]:
        """The ids of `prompt` with every control token that overlaps a span of untrusted text tokenised as text."""
        ids = self._encode_core(prompt, spans)
        if not add_special_tokens:
            return ids
        plain = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        for k in range(len(full) - len(plain) + 1):  # the special tokens the tokenizer adds around the text (BOS)
            if full[k : k + len(plain)] == plain:
                return full[:k] + ids + full[k + len(plain) :]
        raise ValueError(
            "cannot tell the special tokens this tokenizer adds around a prompt (BOS/EOS) from the prompt's own"
        )

    def _encode_core(self, prompt: str, spans: Sequence[Span]) -> list[int]:
        encoding = self.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        injected = {
            i
            for i, (token, (s, e)) in enumerate(zip(ids, offsets))
            if token in self.control_ids and _overlaps(s, e, spans)
        }
        if not injected:
            return list(ids)
        # The prompt's own control tokens bound stretches that the tokenizer encodes independently of each other.
        bounds = [i for i, token in enumerate(ids) if token in self.control_ids and i not in injected] + [len(ids)]
        out: list[int] = []
        first, start = 0, 0
        for bound in bounds:
            end = offsets[bound][0] if bound < len(ids) else len(prompt)
            if injected.intersection(range(first, bound)):
                out += self._split_encode(prompt[start:end])
            else:
                out += ids[first:bound]
            if bound < len(ids):
                out.append(ids[bound])
                start = offsets[bound][1]
            first = bound + 1
        return out

    def _split_encode(self, text: str) -> list[int]:
        # A private copy of the backend with special tokens split: toggling the shared tokenizer's own flag per
        # call would race with other threads' calls.
        if self._splitting is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None:
                raise ValueError(
                    f"the question or a document holds special-token text, which {type(self.tokenizer).__name__} "
                    "(not a "
                    f"fast tokenizer) cannot tokenise as plain text; remove that text or use a fast tokenizer"
                )
            from tokenizers import Tokenizer

            splitting = Tokenizer.from_str(backend.to_str())
            splitting.encode_special_tokens = True
            self._splitting = splitting
        return self._splitting.encode(text, add_special_tokens=False).ids
