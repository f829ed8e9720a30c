"""The decoding fields a framework's FIDES model object declares (LangChain's FidesLLM and ChatFides, LlamaIndex's
FidesLLM), defined once with their defaults, bounds and descriptions; each front door inherits them and adds its own
(its temperature, its model and prompt fields)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from fides_rag.calls.options import resolve_method
from fides_rag.method.config import FidesConfig
from fides_rag.prompts.raw import check_no_context_path


def check_fides_config(value: Any) -> Any:
    """`value` when it is a FidesConfig or None, else a ValueError naming its type: a dict is refused, not built into
    a FidesConfig on the source's defaults (constants given by name fold onto the decoder's, `fold_fides_constants`)."""
    if value is not None and not isinstance(value, FidesConfig):
        raise ValueError(f"fides_config must be a fides_rag.FidesConfig or None, got {type(value).__name__}")
    return value


class DecodingFields(BaseModel):
    """A FIDES model object's default decoding options, which one call's keywords may override (`CallOptions.parse`):
    the rule and its constants, the token budget, stops, greedy or sampled decoding, strict mode, how the no-context
    path is built and how concurrent calls are batched; each is checked when the object is made. Temperature is each front door's own (LangChain's default is
    None, LlamaIndex's 1.0)."""

    method: str = Field(default="fides", description="Decoding method: fides (default), standard, cad, adacad, or any "
                        "rule of fides_rag.available_methods() (register_method adds one), optionally behind a gate "
                        "of fides_rag.available_gates() as rule+gate (e.g. fides+agree).")
    fides_config: FidesConfig | None = Field(
        default=None, description="FIDES's constants as a fides_rag.FidesConfig (e.g. FidesConfig.from_file('calibrated.json') "
        "from `fides-rag calibrate`); None: the decoder's.")
    max_new_tokens: int = Field(default=128, gt=0, description="Most tokens to generate per call (unset: the "
                                "decoder's own budget).")
    stop: list[str] | None = Field(default=None, description="Stop strings of any token length; the answer is cut "
                                      "before the first one.")
    do_sample: bool = Field(default=False, description="Sample instead of greedy decoding.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass (only with do_sample=True).")
    top_k: int = Field(default=0, ge=0, description="Top-k sampling cut-off, 0 disables it (only with do_sample=True).")
    seed: int | None = Field(default=None, description="Seed of the sampler, for reproducible sampling (only with "
                                "do_sample=True).")
    strict: bool = Field(default=False, description="Raise FidesFallbackError instead of falling back (to `standard` when "
                         "a call has no context to contrast, or to guessing the context); also per call: strict=True.")
    no_context_path: str = Field(
        default="emptied", description="How the no-context path is built from a framework's prompt: 'emptied' (the same "
        "prompt with the retrieved text removed) or 'question' (the neutral 'Answer the following question:' and the "
        "question alone, in the model's chat form). fides-rag's own template (documents= with a bare question) is not "
        "affected.")
    max_batch_size: int = Field(default=8, ge=1, description="Most concurrent calls (batches, async calls, threads) "
                                "decoded together in one batch.")
    batch_window_s: float = Field(default=0.005, ge=0, le=10, description="How long a call waits for concurrent calls to "
                                  "share its batch, in seconds.")

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
    def _a_fides_config_or_none(cls, value: Any) -> Any:
        return check_fides_config(value)
