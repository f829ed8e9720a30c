"""What FidesLLM and ChatFides share: their typed fields, the core call layer (`fides_rag.calls`) set up from them, and
LangChain's generate and stream entry points over it (sync and async)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from fides_rag import FidesDecoder, GenerationResult
from fides_rag.calls import (
    DOCUMENTS_INSTRUCTION,
    Answer,
    AnswerLog,
    Call,
    CallFactory,
    CallOptions,
    ChatPlan,
    ChatPrompts,
    DecodingFields,
    FidesFallbackError,
    ToolCalling,
    UnansweredError,
    iterate_in_thread,
)
from fides_rag.calls.decoders import decoder_for, decoder_identity
from fides_rag.calls.options import SAMPLING
from langchain_fides._discovery import model_parent_var

__all__ = ["FidesFallbackError", "FidesParams", "UnansweredError"]
CALL_OPTIONS = ("documents", "fides_question", "max_tokens", "model")
"""What a call may pass beside the core's options (method, max_new_tokens, strict, sampling, grammar, ...)."""


class FidesParams(DecodingFields):
    """Typed options of a FIDES LangChain model (shared by FidesLLM and ChatFides): the decoding fields of every front
    door (`DecodingFields`: method, fides_config, max_new_tokens, stop, sampling, strict, no_context_path, batching) and
    LangChain's own below. With no_context_path='question' the question is the last human message, `fides_question`,
    the retriever's query, or a chain input named question/input/query."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    if TYPE_CHECKING:  # each model's own: one call's result, and its stream

        def _results(self, input: Any, stop: list[str] | None, parent: Any, kwargs: dict[str, Any]) -> Any: ...

        def _stream_items(
            self, input: Any, stop: list[str] | None, parent: Any, kwargs: dict[str, Any]
        ) -> Iterator[Any]: ...

    decoder: FidesDecoder | None = Field(default=None, exclude=True)
    """A ready FidesDecoder (share one between several LangChain objects to load the model once)."""
    model: Any = Field(default=None, exclude=True)
    """A Hugging Face causal LM to wrap (with `tokenizer`), when no decoder is given."""
    tokenizer: Any = Field(default=None, exclude=True)
    """The tokenizer of `model`."""
    model_id: str | None = None
    """Bundled alias (gemma3-270m, smollm2-135m-instruct), hub id or local path; loaded when no decoder/model is
    given."""
    max_tokens: int | None = None
    """LangChain's standard name for max_new_tokens; wins when set."""
    temperature: float | None = None
    """Sampling temperature (0 means greedy; only used with do_sample=True)."""
    apply_chat_template: bool | None = None
    """Wrap raw LangChain prompts in the tokenizer's chat template (None: when the tokenizer has one)."""

    _answers: AnswerLog = PrivateAttr(default_factory=lambda: AnswerLog(1))
    _calls: CallFactory = PrivateAttr()
    _call_options: ClassVar[tuple[str, ...]] = CALL_OPTIONS

    @model_validator(mode="after")
    def _setup(self) -> Any:
        if self.decoder is None:  # a decoder given wins over model=, tokenizer= and model_id=
            self.decoder = decoder_for(
                model=self.model,
                tokenizer=self.tokenizer,
                model_id=self.model_id,
                method=self.method,
                max_new_tokens=self.max_new_tokens,
            )
        if "max_new_tokens" not in self.model_fields_set:
            # A shared decoder's budget (e.g. ChatFides(decoder=llm.decoder)) is the default, not 128.
            object.__setattr__(self, "max_new_tokens", self.decoder.max_new_tokens)
        self._options(None, {})  # bad defaults fail here, not at the first call
        self._calls = CallFactory(
            self.decoder,
            max_batch_size=self.max_batch_size,
            batch_window_s=self.batch_window_s,
            use_chat_template=self.apply_chat_template,
            no_context_path=self.no_context_path,
            documents_instruction=getattr(self, "documents_instruction", DOCUMENTS_INSTRUCTION),
        )
        return self

    @classmethod
    def from_model_id(cls, model_id: str, *, device: str = "auto", dtype: Any = None, **kwargs: Any) -> Any:
        """Load `model_id` (cached by fides_rag.load_model) and wrap it; kwargs are this class's fields."""
        decoder = decoder_for(
            model_id=model_id,
            device=device,
            dtype=dtype,
            method=kwargs.get("method", "fides"),
            max_new_tokens=kwargs.get("max_new_tokens", 128),
        )
        return cls(decoder=decoder, model_id=model_id, **kwargs)

    @property
    def last_result(self) -> GenerationResult | None:
        """The GenerationResult of this object's most recent decoding (alphas, steps, prompts, notes); None before the
        first call. A call answered from LangChain's LLM cache leaves it unchanged; objects shared between threads
        see whichever call finished last."""
        return self._answers.last

    @property
    def _dec(self) -> FidesDecoder:
        assert self.decoder is not None
        return self.decoder

    def _fides_params(self) -> dict[str, Any]:
        """Everything that changes the output; LangChain's LLM cache key and traces are built from it."""
        fields = (
            "model_id",
            "apply_chat_template",
            "strict",
            "no_context_path",
            "method",
            "do_sample",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "stop",
        )
        return {
            **decoder_identity(self._dec),
            "fides_config": None if self.fides_config is None else repr(self.fides_config),
            "max_new_tokens": self.max_tokens if self.max_tokens is not None else self.max_new_tokens,
            **{name: getattr(self, name) for name in fields},
        }

    # -- the call layer -------------------------------------------------------------------------------

    def _options(self, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> CallOptions:
        """This object's fields overridden by one call's keywords (unknown keywords: a TypeError naming them)."""
        names = ("method", "fides_config", "strict", *SAMPLING)
        defaults = {name: getattr(self, name) for name in names}
        defaults["max_new_tokens"] = self.max_tokens if self.max_tokens is not None else self.max_new_tokens
        call = {k: v for k, v in kwargs.items() if not k.startswith("ls_") and k not in ("max_tokens", "model")}
        if kwargs.get("max_tokens") is not None:
            call["max_new_tokens"] = kwargs["max_tokens"]
        call["stop"] = [*(self.stop or []), *(stop or [])]
        return CallOptions.parse(defaults, call, allowed=self._call_options, who=type(self).__name__)

    def _planner(self, calling: ToolCalling | None = None) -> ChatPrompts:
        return self._calls.planner(calling)

    def _call(self, plan: ChatPlan, opts: CallOptions, calling: ToolCalling | None = None) -> Call:
        return self._calls.call(
            plan, opts, calling, extra={"model_name": self.model_id or type(self._dec.model).__name__}
        )

    def _run(self, call: Call) -> Answer:
        return self._answered(self._answers.add(call.run()))

    @staticmethod
    def _answered(answer: Answer) -> Answer:
        """`answer`, or UnansweredError when an agent's turn answered nothing (with the cause; the record is kept)."""
        if answer.unanswered is not None:
            raise UnansweredError(answer.unanswered, answer)
        return answer

    # -- LangChain's entry points: the same for both models, over `_results` (one call's result) and `_stream_items`

    def _generate(self, input: Any, stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> Any:
        return self._results(input, stop, run_manager.parent_run_id if run_manager else None, kwargs)

    async def _agenerate(
        self, input: Any, stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        return await asyncio.to_thread(
            self._results, input, stop, run_manager.parent_run_id if run_manager else None, kwargs
        )

    def _stream(
        self, input: Any, stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[Any]:
        """The chunks, each one's text reported to the run manager as a new token. langchain-core's BaseChatModel.stream
        calls this without a run manager: the parent run is then the one `model_parent_var` holds."""
        parent = run_manager.parent_run_id if run_manager else model_parent_var.get()
        for chunk in self._stream_items(input, stop, parent, kwargs):
            if run_manager and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self, input: Any, stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """`_stream` for asyncio: the chunks made in a worker thread."""
        parent = run_manager.parent_run_id if run_manager else model_parent_var.get()
        async for chunk in iterate_in_thread(lambda: self._stream_items(input, stop, parent, kwargs)):
            if run_manager and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
