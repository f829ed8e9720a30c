"""The request bodies this server accepts: OpenAI's chat and completion fields that it honours (the agents' fields
in `agent_fields`), plus FIDES's extras (`documents`, `method`, `fides_config`, `no_context_path`). The request options'
fields take their bounds and descriptions from `REQUEST_OPTIONS` (unset: None, the server's default). Any other field
is refused, never ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from fides_rag.calls import option_field
from fides_rag.serve.agent_fields import AgentFields, NoOpFields


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """One message; `developer` is read as `system`."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(_Strict):
    include_usage: bool = False


class Sampling(NoOpFields, _Strict):
    """The fields every generation request shares."""

    model: str | None = None
    max_tokens: int | None = option_field("max_new_tokens", default=None)
    temperature: float | None = option_field(
        "temperature",
        default=None,
        gt=None,
        ge=0,
        le=2,
        description="Sampling temperature, OpenAI's range: 0 decodes greedily.",
    )
    top_p: float | None = option_field("top_p", default=None)
    seed: int | None = option_field("seed")
    stop: str | list[str] | None = option_field(
        "stop", description="Up to 4 stop strings; the answer is cut before the first one."
    )
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # FIDES's extras (the openai client sends them with extra_body)
    documents: list[StrictStr] | None = None
    method: str | None = option_field(
        "method", default=None, description="The decoding method (unset: the server's --method)."
    )
    fides_config: dict[str, Any] | None = option_field(
        "fides_config", description="FIDES's constants as FidesConfig's fields (unset: the server's)."
    )
    no_context_path: Literal["emptied", "question"] | None = option_field("no_context_path", default=None)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(stops)}")
        return [s for s in stops if s]

    def stops(self) -> list[str]:
        return list(self.stop or [])


class ChatCompletionRequest(AgentFields, Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = option_field("max_new_tokens", default=None)

    def budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[str]
    logprobs: int | None = option_field("logprobs")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError(f"one prompt per request, got a list of {len(value)}")
        if not (value if isinstance(value, str) else value[0]).strip():
            raise ValueError("the prompt is empty: send the text to complete")
        return value

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def budget(self) -> int | None:
        return self.max_tokens

    def top_logprob_count(self) -> int | None:
        return self.logprobs


GenerationRequest = ChatCompletionRequest | CompletionRequest
"""A body of either generation endpoint."""


def supported_fields(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)
