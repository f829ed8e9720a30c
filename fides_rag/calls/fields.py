"""The decoding fields a framework's FIDES model object declares (LangChain's FidesLLM and ChatFides, LlamaIndex's
FidesLLM), defined once with the request options' defaults, bounds and descriptions; each front door inherits them
and adds its own (its temperature, its model and prompt fields)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from fides_rag.calls.options import resolve_method
from fides_rag.generation.request_options import option_field
from fides_rag.method.config import FidesConfig
from fides_rag.prompts.raw import check_no_context_path


def check_fides_config(value: object) -> FidesConfig | None:
    """`value` when it is a FidesConfig or None, else a ValueError naming its type: a dict is refused, not built into
    a FidesConfig on the source's defaults (constants given by name fold onto the decoder's, `fold_fides_constants`)."""
    if value is not None and not isinstance(value, FidesConfig):
        raise ValueError(f"fides_config must be a fides_rag.FidesConfig or None, got {type(value).__name__}")
    return value


class DecodingFields(BaseModel):
    """A FIDES model object's default decoding options, which one call's keywords may override (`CallOptions.parse`):
    the rule and its constants, the token budget, stops, greedy or sampled decoding, strict mode, how the no-context
    path is built (defaults, bounds and descriptions: the request options, `REQUEST_OPTIONS`), and how concurrent calls
    are batched; each is checked when the object is made. Temperature is each front door's own (LangChain's default is
    None, LlamaIndex's 1.0)."""

    method: str = option_field("method")
    fides_config: FidesConfig | None = option_field("fides_config")
    max_new_tokens: int = option_field("max_new_tokens")
    stop: list[str] | None = option_field("stop")
    do_sample: bool = option_field("do_sample")
    top_p: float = option_field("top_p")
    top_k: int = option_field("top_k")
    seed: int | None = option_field("seed")
    strict: bool = option_field("strict")
    no_context_path: str = option_field("no_context_path")
    max_batch_size: int = Field(
        default=8,
        ge=1,
        description="Most concurrent calls (batches, async calls, threads) decoded together in one batch.",
    )
    batch_window_s: float = Field(
        default=0.005,
        ge=0,
        le=10,
        description="How long a call waits for concurrent calls to share its batch, in seconds.",
    )

    @field_validator("method")
    @classmethod
    def _a_registered_method(cls, value: str) -> str:
        resolve_method(value)
        return value

    @field_validator("no_context_path")
    @classmethod
    def _a_known_no_context_path(cls, value: str) -> str:
        return check_no_context_path(value)

    @field_validator("fides_config", mode="before")
    @classmethod
    def _a_fides_config_or_none(cls, value: object) -> FidesConfig | None:
        return check_fides_config(value)
