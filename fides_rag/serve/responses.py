"""Response bodies in OpenAI's shapes (chat.completion, chat.completion.chunk, text_completion), each with FIDES's
record in the extra field `fides` (in a stream: in its last chunk)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fides_rag.calls import Answer
from fides_rag.serve.tool_streaming import tool_call_deltas


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_completion(id_: str, model: str, answer: Answer, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.text if answer.text or not answer.tool_calls else None,
        "refusal": None,
    }
    if answer.tool_calls:
        message["tool_calls"] = [call.openai() for call in answer.tool_calls]
    return {
        "id": id_,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": answer.finish_reason}],
        "usage": answer.usage,
        "fides": answer.record,
    }


def text_completion(id_: str, model: str, answer: Answer, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": id_,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": answer.text, "logprobs": logprobs, "finish_reason": answer.finish_reason}],
        "usage": answer.usage,
        "fides": answer.record,
    }


class ChunkWriter:
    """Server-sent events of one streamed answer, in the chunk shape of its endpoint."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _event(self, choices: list[dict[str, Any]], **extra: object) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    def _choice(
        self, delta: dict[str, Any], finish: str | None, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": delta.get("content", ""), "logprobs": logprobs, "finish_reason": finish}
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def start(self) -> str | None:
        return self._event([self._choice({"role": "assistant", "content": ""}, None)]) if self.chat else None

    def delta(self, text: str) -> str:
        return self._event([self._choice({"content": text}, None)])

    def end(
        self, answer: Answer, last_text: str, include_usage: bool, logprobs: dict[str, Any] | None = None
    ) -> Iterator[str]:
        """The rest of the answer: its last text, its tool calls, the finish chunk (with the logprobs), then with
        `include_usage` a usage chunk; FIDES's record rides in whichever chunk is last."""
        if last_text:
            yield self.delta(last_text)
        for delta in tool_call_deltas(answer.tool_calls):
            yield self._event([self._choice(delta, None)])
        record = {} if include_usage else {"fides": answer.record}
        yield self._event([self._choice({}, answer.finish_reason, logprobs)], **record)
        if include_usage:
            yield self._event([], usage=answer.usage, fides=answer.record)
        yield "data: [DONE]\n\n"

    @staticmethod
    def error(body: dict[str, Any]) -> list[str]:
        return [f"data: {json.dumps(body)}\n\n", "data: [DONE]\n\n"]
