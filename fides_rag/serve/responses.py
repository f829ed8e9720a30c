"""Response bodies in OpenAI's shapes (chat.completion, chat.completion.chunk, text_completion), each with FIDES's
record in the extra field `fides`."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fides_rag.calls import Answer


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_completion(id_: str, model: str, answer: Answer) -> dict[str, Any]:
    return {
        "id": id_, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text, "refusal": None},
                     "logprobs": None, "finish_reason": answer.finish_reason}],
        "usage": answer.usage, "fides": answer.record,
    }


def text_completion(id_: str, model: str, answer: Answer) -> dict[str, Any]:
    return {
        "id": id_, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": answer.text, "logprobs": None, "finish_reason": answer.finish_reason}],
        "usage": answer.usage, "fides": answer.record,
    }


class ChunkWriter:
    """Server-sent events of one streamed answer, in the chunk shape of its endpoint."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def start(self) -> str | None:
        return self._event([self._choice(None, None, role=True)]) if self.chat else None

    def delta(self, text: str) -> str:
        return self._event([self._choice(text, None)])

    def end(self, answer: Answer, include_usage: bool) -> list[str]:
        events = [self._event([self._choice(None, answer.finish_reason)], fides=answer.record)]
        if include_usage:
            events.append(self._event([], usage=answer.usage))
        return [*events, "data: [DONE]\n\n"]

    @staticmethod
    def error(body: dict[str, Any]) -> list[str]:
        return [f"data: {json.dumps(body)}\n\n", "data: [DONE]\n\n"]
