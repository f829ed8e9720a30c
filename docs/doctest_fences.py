"""Griffe extension for the API reference: a docstring's run of `>>>` example lines renders as a code block
(Markdown would otherwise read them as nested quotes)."""

from __future__ import annotations

import re
from typing import Any

import griffe

DOCTEST_RUN = re.compile(r"(?m)^(?P<indent>[ \t]*)>>> .*(?:\n(?P=indent)(?:>>> |\.\.\. ).*)*")


def fence(text: str) -> str:
    return DOCTEST_RUN.sub(lambda m: f"{m['indent']}```pycon\n{m[0]}\n{m['indent']}```", text)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence(obj.docstring.value)
