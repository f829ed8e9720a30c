"""Agent middleware for `langchain.agents.create_agent` (the `agents` extra: `langchain>=1`).

`ToolCallFirst()` makes a retrieve-then-answer agent of a model too small to decide to call a tool: a forced call
until a tool has answered, then none. It works under `agent.invoke` and `agent.ainvoke` alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest
except ImportError as err:  # pragma: no cover - the extra is missing
    raise ImportError("langchain_fides.middleware needs langchain>=1: pip install 'langchain-fides[agents]'") from err
from langchain_core.messages import ToolMessage


class ToolCallFirst(AgentMiddleware):
    """`tool_choice="any"` until a tool message is in the conversation, then `"none"` (the model answers)."""

    @staticmethod
    def _choose(request: ModelRequest) -> ModelRequest:
        answered = any(isinstance(m, ToolMessage) for m in request.messages)
        return request.override(tool_choice="none" if answered else "any")

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Any]) -> Any:
        return handler(self._choose(request))

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        return await handler(self._choose(request))
