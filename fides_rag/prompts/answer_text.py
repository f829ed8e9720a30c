"""An answer's text without what is not the answer, cut in one place for every front door (the decoder's results and
streams, and so the framework integrations and the server): a document label copied from fides-rag's template at
its start ("Document [1]: ..."), a `<tool_call>` wrapper around a plain answer, and the next turn's role line that
the model began at its end ("\\nUser", "\\nassistant: ..."). Only the text is cut, each cut with a note; the generated
tokens stay as they were (a result's `token_ids` and `steps`)."""

from __future__ import annotations

import re

from fides_rag.prompts.template import PromptTemplate, TemplateLeftovers

ROLE_NAMES = ("user", "human", "assistant", "system")
"""The role lines an answer ends before (a role line is the name alone on its line, or followed by a colon)."""
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_ROLE_LINE = re.compile(rf"\n[ \t]*(?:{'|'.join(ROLE_NAMES)})[ \t]*(?::|$)", re.IGNORECASE | re.MULTILINE)
_ROLE_HEADS = tuple(f"{name}:" for name in ROLE_NAMES)


def _unwrapped(text: str) -> tuple[str, list[str]]:
    """`text` without a `<tool_call>` wrapper around a plain answer (the whole text one block, closed or cut), or a
    stray closing tag at its end. A block that holds JSON (a call, or the start of one) is left for the tool parser."""
    stripped = text.strip()
    if stripped.startswith(CALL_OPEN):
        inner = stripped[len(CALL_OPEN) :]
        inner = inner[: -len(CALL_CLOSE)] if inner.endswith(CALL_CLOSE) else inner
        if CALL_OPEN in inner or CALL_CLOSE in inner or inner.lstrip().startswith(("{", "[")):
            return text, []
        return inner.strip(), [f"removed the {CALL_OPEN} wrapper around a plain answer"]
    if stripped.endswith(CALL_CLOSE) and CALL_OPEN not in stripped:
        return stripped[: -len(CALL_CLOSE)], [f"removed a stray {CALL_CLOSE} from the end of the answer"]
    return text, []


def _partial_role_line(text: str) -> int:
    """Length of a last line that may still grow into a role line ("\\nUs", "\\nuser"), else 0."""
    start = text.rfind("\n")
    if start < 0:
        return 0
    line = text[start + 1 :].strip().lower()
    return len(text) - start if any(head.startswith(line) for head in _ROLE_HEADS) else 0


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is the start of `marker`."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])), 0)


class AnswerText:
    """Cuts an answer's text. `template`: the fides-rag template its prompt was rendered with, whose copied labels
    and line starts are cut too (None: prompts given as they are).

    `clean(text)` is for a finished answer; `visible(text)` the part of a growing answer that is safe to stream (a
    possible label, wrapper or role line held back), so the streamed deltas concatenate to the cleaned text."""

    def __init__(self, template: PromptTemplate | None = None) -> None:
        self.leftovers = TemplateLeftovers(template) if template is not None else None

    def clean(self, text: str, *, truncated: bool = False) -> tuple[str, list[str]]:
        """The answer without leftovers, and a note for each cut. `truncated`: it ended at the token limit (a line
        start it ends with is cut too)."""
        notes: list[str] = []
        if self.leftovers is not None:
            text, notes = self.leftovers.clean(text, truncated=truncated)
        text, unwrapped = _unwrapped(text)
        notes += unwrapped
        found = _ROLE_LINE.search(text)
        if found is not None and text[: found.start()].strip():
            notes.append(
                f"removed the next turn's role line {text[found.start() :].strip()[:40]!r} from the end of the answer"
            )
            text = text[: found.start()]
        cut = _partial_role_line(text) if truncated else 0
        if cut and text[:-cut].strip():
            notes.append(f"removed the start of a role line {text[-cut:]!r} from the end of the truncated answer")
            text = text[:-cut]
        return text.strip(), notes

    def visible(self, text: str) -> str:
        """The part of a growing answer that can be streamed now."""
        if self.leftovers is not None:
            text = self.leftovers.visible(text)
        stripped = text.lstrip()
        if stripped.startswith(CALL_OPEN) or CALL_OPEN.startswith(stripped):
            return ""  # a wrapper (or a call) is decided only when the answer ends
        found = _ROLE_LINE.search(text)
        if found is not None:
            text = text[: found.start()]
        cut = max(_partial_role_line(text), _partial_suffix(text, CALL_CLOSE))
        return (text[:-cut] if cut else text).strip()
