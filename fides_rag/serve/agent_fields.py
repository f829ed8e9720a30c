"""The request fields agents send, in OpenAI's shapes: `tools`, `tool_choice`, `parallel_tool_calls`,
`response_format`, `logprobs`/`top_logprobs`; and the fields fides-rag does not implement, accepted at their no-op
values only (`frequency_penalty` and `presence_penalty` 0, `logit_bias` empty), so clients that always send them
work and any other value is refused, never ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fides_rag.calls import option_field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class NoOpFields(_Strict):
    """Fields fides-rag does not implement: accepted at the value that changes nothing, refused otherwise."""

    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _zero(cls, value: float | None) -> float | None:
        if value not in (None, 0):
            raise ValueError(f"only 0 is supported (this server applies no penalty), got {value}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _empty(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("only an empty logit_bias is supported (this server applies no bias)")
        return value


class AgentFields(_Strict):
    """The chat fields of tool-calling agents and structured output."""

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = option_field("logprobs")

    def top_logprob_count(self) -> int | None:
        """Alternatives per token to record (None: no logprobs asked)."""
        return (self.top_logprobs or 0) if self.logprobs else None
