"""Incremental detokenisation: the text of a growing answer, one token at a time, without decoding the whole
answer again at every step (the prefix-offset method of vLLM and TGI). Decoding a window of the last few
tokens, rather than each token alone, keeps what a tokenizer does across token boundaries (SentencePiece's
leading spaces, byte-level tokens that complete a UTF-8 character only together)."""

from __future__ import annotations

from collections.abc import Callable

INCOMPLETE = "\ufffd"
"""What a tokenizer decodes a partial UTF-8 sequence to."""


class IncrementalText:
    """The decoded text of a token sequence as it grows; `text` equals `decode(ids)` for the tokenizers we
    support (checked in tests), and `push` returns only the new characters.

    >>> text = IncrementalText(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    >>> text.push(token_id)   # the characters this token completed ('' while a character is incomplete)
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # the window's first id: decoded again so that the boundary behaves as in the whole
        self._read = 0  # ids up to here are in `text`

    def push(self, token_id: int) -> str:
        """Append one id; return the text it completed."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return ""
        new = after[len(before) :]
        self.text += new
        self._prefix, self._read = self._read, len(self.ids)
        return new
