"""What FidesLLM and ChatFides share: the typed options, the decoder, the two-path plan and metadata."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from fides_rag import FidesConfig, FidesDecoder, GenerationResult, available_methods, load_model
from fides_rag.batching import RequestBatcher, shared_batcher
from fides_rag.generation.settings import sampling_options
from fides_rag.prompts import document_texts
from fides_rag.chat import DOCUMENTS_INSTRUCTION, AnswerStream, ChatPlan, ChatPrompts
from fides_rag.raw_prompts import check_no_context_path
from fides_rag.rules import ContrastRule, accepts_option, get_method

logger = logging.getLogger("langchain_fides")

CALL_OPTIONS = frozenset(
    {
        "documents", "method", "fides_config", "max_new_tokens", "max_tokens", "do_sample", "temperature", "top_p", "top_k", "seed",
        "strict", "fides_question", "json_schema", "regex", "grammar",
    }
)
"""Keyword arguments accepted per call (invoke/stream/batch/.bind)."""
CONSTRAINTS = ("json_schema", "regex", "grammar")
"""Grammar-constrained decoding options (at most one per call)."""


class FidesFallbackError(ValueError):
    """Raised with `strict=True` where FIDES would otherwise fall back (to `standard`, or to guessing the context)."""


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def cache_key_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call options of one invoke/.bind, as plain values for LangChain's LLM cache key."""
    options: dict[str, Any] = {}
    for name in sorted(k for k in kwargs if k in CALL_OPTIONS):
        value = kwargs[name]
        if name == "documents":
            try:
                value = document_texts(value)
            except TypeError:  # reported by the call itself
                value = repr(value)
        elif name == "fides_config" or (name == "method" and not isinstance(value, str)):
            value = repr(value)
        options[name] = value
    return options


Plan = ChatPlan
"""How one call will be decoded (fides_rag.chat.ChatPlan)."""


@dataclass
class CallOptions:
    method: str | ContrastRule
    requested: str
    max_new_tokens: int
    generation: dict[str, Any]
    stop: list[str]
    strict: bool = False
    constraint: dict[str, Any] = field(default_factory=dict)
    """At most one of json_schema/regex/grammar, passed to the decoder."""


class FidesParams(BaseModel):
    """Typed options of a FIDES LangChain model (shared by FidesLLM and ChatFides)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    decoder: FidesDecoder | None = Field(default=None, exclude=True)
    """A ready FidesDecoder (share one between several LangChain objects to load the model once)."""
    model: Any = Field(default=None, exclude=True)
    """A Hugging Face causal LM to wrap (with `tokenizer`), when no decoder is given."""
    tokenizer: Any = Field(default=None, exclude=True)
    """The tokenizer of `model`."""
    model_id: str | None = None
    """Bundled alias (gemma3-270m, smollm2-135m-instruct), hub id or local path; loaded when no decoder/model is given."""
    method: str = "fides"
    """Decoding method: fides (default), standard, cad, adacad, or any registered contrast rule."""
    fides_config: FidesConfig | None = None
    """FIDES constants (weights, lambda_, alpha_min, ...); None uses the decoder's config."""
    max_new_tokens: int = 128
    """Most tokens to generate per call."""
    max_tokens: int | None = None
    """LangChain's standard name for max_new_tokens; wins when set."""
    do_sample: bool = False
    """Sample instead of greedy decoding."""
    temperature: float | None = None
    """Sampling temperature (0 means greedy; only used with do_sample=True)."""
    top_p: float = 1.0
    """Nucleus sampling mass (only with do_sample=True)."""
    top_k: int = 0
    """Top-k sampling (0 disables; only with do_sample=True)."""
    seed: int | None = None
    """Seed of the sampler (only with do_sample=True)."""
    stop: list[str] | None = None
    """Stop strings of any token length; the answer is cut before the first one."""
    apply_chat_template: bool | None = None
    """Wrap raw LangChain prompts in the tokenizer's chat template (None: when the tokenizer has one)."""
    strict: bool = False
    """Raise FidesFallbackError instead of falling back (to `standard`, or to guessing the context)."""
    no_context_path: str = "emptied"
    """How the no-context path is built from a chain's prompt: 'emptied' (the same prompt with the documents removed)
    or 'question' (the neutral "Answer the following question:" and the question, in the model's chat form; the
    question is the last human message, `fides_question`, the retriever's query, or a chain input named
    question/input/query). fides-rag's own template (documents= with a bare question) is not affected."""
    max_batch_size: int = Field(default=8, ge=1)
    """Most concurrent calls (batch/abatch, concurrent invoke/ainvoke/stream) decoded together in one batch."""
    batch_window_s: float = Field(default=0.005, ge=0, le=10)
    """How long a call waits for concurrent calls to share its batch, in seconds."""

    _last_result: GenerationResult | None = PrivateAttr(default=None)
    _call_options: ClassVar[frozenset[str]] = CALL_OPTIONS

    @model_validator(mode="after")
    def _setup(self) -> Any:
        if self.method not in available_methods():
            raise ValueError(f"unknown method {self.method!r}; available methods: {', '.join(available_methods())}")
        check_no_context_path(self.no_context_path)
        if self.decoder is None:
            if self.model is not None and self.tokenizer is not None:
                model, tokenizer = self.model, self.tokenizer
            elif self.model_id is not None:
                model, tokenizer = load_model(self.model_id)
            else:
                raise ValueError("give a decoder=FidesDecoder(...), a model= and tokenizer=, or a model_id= to load")
            # fides_config is applied per call (_options), so any method can be the default.
            self.decoder = FidesDecoder(model, tokenizer, method=self.method, max_new_tokens=self.max_new_tokens)
        if not isinstance(self.decoder, FidesDecoder):
            raise TypeError(f"decoder must be a FidesDecoder, got {type(self.decoder).__name__}")
        if "max_new_tokens" not in self.model_fields_set:
            # A shared decoder's budget (e.g. ChatFides(decoder=llm.decoder)) is the default, not 128.
            object.__setattr__(self, "max_new_tokens", self.decoder.max_new_tokens)
        self._max_new(self.max_tokens if self.max_tokens is not None else self.max_new_tokens)
        return self

    @classmethod
    def from_model_id(cls, model_id: str, *, device: str = "auto", dtype: Any = None, **kwargs: Any) -> Any:
        """Load `model_id` (cached by fides_rag.load_model) and wrap it; kwargs are this class's fields."""
        model, tokenizer = load_model(model_id, device=device, dtype=dtype)
        decoder = FidesDecoder(model, tokenizer, method=kwargs.get("method", "fides"), max_new_tokens=kwargs.get("max_new_tokens", 128))
        return cls(decoder=decoder, model_id=model_id, **kwargs)

    # -- options ------------------------------------------------------------------------------------

    @staticmethod
    def _max_new(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {value!r}")
        return value

    @property
    def last_result(self) -> GenerationResult | None:
        """The GenerationResult of this object's most recent decoding (alphas, steps, prompts, notes).

        None before the first call. A call answered from LangChain's LLM cache decodes nothing and
        leaves it unchanged. Objects shared between threads see whichever call finished last.
        """
        return self._last_result

    def _fides_params(self) -> dict[str, Any]:
        """Everything that changes the output; LangChain's LLM cache key and traces are built from it."""
        dec = self._dec
        return {
            "model_id": self.model_id,
            # A model without a name (built in memory) is told apart by its object: no cache hits across models.
            "model": f"{type(dec.model).__name__}:{getattr(dec.model, 'name_or_path', '') or f'object-{id(dec.model)}'}",
            "decoder_config": repr(dec.config),
            "decoder_prompt_template": _digest(getattr(dec, "prompt_template", None)),
            "decoder_use_chat_template": getattr(dec, "use_chat_template", None),
            "apply_chat_template": self.apply_chat_template,
            "strict": self.strict,
            "no_context_path": self.no_context_path,
            "method": self.method,
            "fides_config": None if self.fides_config is None else repr(self.fides_config),
            "max_new_tokens": self.max_tokens if self.max_tokens is not None else self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
        }

    def _options(self, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> CallOptions:
        unknown = sorted(k for k in kwargs if k not in self._call_options and not k.startswith("ls_") and k != "model")
        if unknown:
            raise TypeError(f"{type(self).__name__} got unsupported call options {unknown}; supported: {sorted(self._call_options)}")
        constraint = {k: kwargs[k] for k in CONSTRAINTS if kwargs.get(k) is not None}
        if len(constraint) > 1:
            raise ValueError(f"give at most one of json_schema=, regex= and grammar=, got {', '.join(constraint)}")
        method = kwargs.get("method", self.method)
        config = kwargs.get("fides_config", self.fides_config)
        if config is not None and not isinstance(config, FidesConfig):
            raise TypeError(f"fides_config must be a FidesConfig, got {type(config).__name__}")
        requested = method if isinstance(method, str) else getattr(method, "name", type(method).__name__)
        if isinstance(method, str) and config is not None and accepts_option(method, "config"):
            method = get_method(method, config=config)  # the rules that take a config (FIDES) get this one
        max_new = kwargs.get("max_tokens", kwargs.get("max_new_tokens"))
        if max_new is None:
            max_new = self.max_tokens if self.max_tokens is not None else self.max_new_tokens
        generation = sampling_options(*(kwargs.get(k, getattr(self, k)) for k in ("do_sample", "temperature", "top_p", "top_k", "seed")))
        stops = [s for s in [*(self.stop or []), *(stop or [])] if isinstance(s, str) and s]
        strict = kwargs.get("strict", self.strict)
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        return CallOptions(method, requested, self._max_new(max_new), generation, list(dict.fromkeys(stops)), strict, constraint)

    # -- prompts ------------------------------------------------------------------------------------

    @property
    def _dec(self) -> FidesDecoder:
        assert self.decoder is not None
        return self.decoder

    @property
    def _chat(self) -> ChatPrompts:
        """The core's conversation planner with this object's chat-template use and no-context design."""
        has = bool(getattr(self._dec.tokenizer, "chat_template", None))
        use = has if self.apply_chat_template is None else bool(self.apply_chat_template and has)
        instruction = getattr(self, "documents_instruction", DOCUMENTS_INSTRUCTION)
        return ChatPrompts(self._dec.tokenizer, context_window=self._dec.context_window, use_chat_template=use,
                           no_context_path=self.no_context_path, documents_instruction=instruction, template=self._dec.prompt_template)

    def _render_messages(self, messages: list[tuple[str, str]]) -> str:
        return self._chat.render(messages)

    def _prompt_plan(
        self, messages: list[tuple[str, str]], texts: list[str], source: str, max_new: int, *,
        drop_in_no_context: Sequence[int] = (), question: str | None = None, chat: ChatPrompts | None = None,
    ) -> Plan:
        """The prompt pair of `messages` with `texts` contrasted where they stand (`ChatPrompts.pair`; `chat`: the
        planner to use, default this object's)."""
        return (chat or self._chat).pair(messages, texts, source, max_new, drop_in_no_context=drop_in_no_context, question=question)

    def _retriever_plan(
        self, messages: list[tuple[str, str]], found: list[Any], retrieved: list[Any] | None, max_new: int, where: str, question: str | None,
        chat: ChatPrompts | None = None,
    ) -> Plan:
        """The prompt pair for the retrieved documents the run-tree recorder found verbatim in `where`, with a
        note for retrieved documents it did not find there."""
        plan = self._prompt_plan(messages, [d.page_content for d in found], "retriever", max_new, question=question, chat=chat)
        found_texts = {d.page_content for d in found}
        missing = len({d.page_content for d in retrieved or [] if d.page_content.strip()} - found_texts)
        if missing:
            note = (
                f"{missing} of the {missing + len(found)} documents retrieved in this run were not found verbatim in {where} "
                f"(rewritten by a formatter?); their text, if any, stays in both paths"
            )
            logger.warning(note)
            plan.notes.append(note)
        return plan

    def _plain_plan(self, messages: list[tuple[str, str]], why: str, question: str | None = None, chat: ChatPrompts | None = None) -> Plan:
        return (chat or self._chat).plain(messages, why, question)

    def _check_fallback(self, plan: Plan, opts: CallOptions) -> None:
        """Raise under strict mode, else log a warning, when the plan does not use the documents as asked."""
        if plan.kind == "template" and not plan.documents and plan.fallback is None:
            plan.fall_back("the documents given were empty", "decoded with 'standard' on the question alone")
        if plan.fallback is None or opts.requested == "standard":
            return
        if opts.strict:
            raise FidesFallbackError(
                f"strict=True: {plan.fallback}, so method {opts.requested!r} cannot contrast the documents as asked. "
                f"Pass documents= with the texts as they appear in the prompt, use fides_rag_prompt(), or set strict=False "
                f"to accept the fallback (it is then logged and recorded in the metadata's notes)"
            )
        logger.warning(plan.notes[0])

    # -- decoding -----------------------------------------------------------------------------------

    def _common(self, plan: Plan, opts: CallOptions) -> dict[str, Any]:
        self._check_fallback(plan, opts)
        stop = plan.stop_strings(opts.stop, self._dec.prompt_template)
        return dict(method=plan.method or opts.method, max_new_tokens=opts.max_new_tokens, stop=stop, **opts.generation, **opts.constraint)

    def _finish(self, plan: Plan, result: GenerationResult) -> GenerationResult:
        """Clean template leftovers from an answer to fides-rag's template; remember the result."""
        result = plan.finish(result, self._dec.prompt_template)
        self._last_result = result
        return result

    @property
    def _batcher(self) -> RequestBatcher:
        """The request batcher every LangChain object on this decoder shares: concurrent calls decode together."""
        return shared_batcher(self._dec, max_batch_size=self.max_batch_size, window_s=self.batch_window_s)

    def _decode(self, plan: Plan, opts: CallOptions) -> GenerationResult:
        prompt, documents = plan.prompt()
        result = self._batcher.generate(prompt, documents, **self._common(plan, opts))
        return self._finish(plan, result)

    def _decode_stream(self, plan: Plan, opts: CallOptions) -> Iterator[str | GenerationResult]:
        """Text deltas, then the GenerationResult as the last item."""
        prompt, documents = plan.prompt()
        stream = self._batcher.stream(prompt, documents, **self._common(plan, opts))
        answer = AnswerStream(plan, self._dec.prompt_template)
        try:
            for delta in stream:
                shown = answer.feed(delta)
                if shown:
                    yield shown
        finally:
            stream.close()
        assert stream.result is not None
        result, last = answer.finish(stream.result)
        self._last_result = result
        if last:
            yield last
        yield result

    def _metadata(self, plan: Plan, opts: CallOptions, result: GenerationResult) -> dict[str, Any]:
        """The result's metadata, with what only this call knows: where the documents came from and its own notes."""
        return {**plan.metadata(result), "model_name": self.model_id or type(self._dec.model).__name__, "requested_method": opts.requested}

