"""FidesLLM: a LlamaIndex LLM that decodes with FIDES, using the retrieved nodes as the context path."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any, Optional

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.chat_engine.condense_plus_context import DEFAULT_CONTEXT_PROMPT_TEMPLATE
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import LLMPredictEndEvent, LLMPredictStartEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.llm import astream_completion_response_to_tokens, stream_completion_response_to_tokens
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen

from fides_rag import FidesConfig, FidesDecoder, GenerationResult, available_methods, load_model
from fides_rag.batching import RequestBatcher, shared_batcher
from fides_rag.prompts import TemplateLeftovers, document_texts, fit_texts, template_stops
from fides_rag.rules import accepts_option, get_method

from llama_index.llms.fides.context import (
    CONTEXT_VARIABLES,
    check_has_user_message,
    find_context,
    prompt_type,
    split_context_from_messages,
    split_prompt_args,
    with_context_message,
)
from llama_index.llms.fides.prompts import is_fides_rag_template
from llama_index.llms.fides.rendering import render_messages

dispatcher = get_dispatcher(__name__)
logger = logging.getLogger("llama_index.llms.fides")

GENERATION_OPTIONS: tuple[str, ...] = ("method", "max_new_tokens", "stop", "do_sample", "temperature", "top_p", "top_k", "seed")
"""Per-call overrides accepted by complete/chat/predict and their stream/async forms."""
CALL_OPTIONS: tuple[str, ...] = (*GENERATION_OPTIONS, "strict", "documents", "no_context_prompt")


class FidesFallbackError(ValueError):
    """Raised with `strict=True` where FidesLLM would otherwise decode with `standard` for want of a context."""


class _Pair:
    """The two prompts of one call and how they were found.

    With `question` and `documents` set, fides-rag's own 2-shot template builds both prompts (the
    decoder renders them); otherwise `context_prompt` / `no_context_prompt` are decoded as they are.
    `fallback` says why there is nothing to contrast (None: there is).
    """

    def __init__(
        self, context_prompt: str, no_context_prompt: str | None, info: dict[str, Any], *,
        question: str | None = None, documents: list[str] | None = None, fallback: str | None = None,
    ) -> None:
        self.context_prompt = context_prompt
        self.no_context_prompt = no_context_prompt
        self.info = info
        self.question = question
        self.documents = documents
        self.fallback = fallback
        if fallback is not None:
            info.setdefault("notes", []).insert(0, f"{fallback}: decoded with 'standard'")

    @property
    def uses_template(self) -> bool:
        return self.documents is not None


class FidesLLM(CustomLLM):
    """A LlamaIndex LLM that answers from the retrieved context with FIDES dual-path contrastive decoding.

    In query and chat engines the retrieved text (``context_str`` / ``context_msg``) forms the context
    path; the same prompt with that text emptied forms the no-context path. Plain ``complete``/``chat``
    calls decode normally unless given ``documents=[...]``.

    >>> llm = FidesLLM.from_model_id("smollm2-135m-instruct", method="fides", max_new_tokens=64)
    >>> index.as_query_engine(llm=llm).query("In which city is the Eiffel Tower located?")
    >>> llm.last_result.alphas   # per-token contrast strengths of the last generation
    """

    model_name: str = Field(default="fides", description="Name of the backbone, reported in metadata.")
    method: str = Field(default="fides", description="Decoding method: one of fides_rag.available_methods() (fides, cad, adacad, standard).")
    max_new_tokens: int = Field(default=128, gt=0, description="Default token budget per generation; reported as metadata.num_output.")
    stop: Optional[list[str]] = Field(default=None, description="Stop strings; the answer is cut before the first one.")
    do_sample: bool = Field(default=False, description="Sample instead of greedy decoding.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (only with do_sample=True).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass (only with do_sample=True).")
    top_k: int = Field(default=0, ge=0, description="Top-k sampling cut-off, 0 disables it (only with do_sample=True).")
    seed: Optional[int] = Field(default=None, description="Seed of the sampler, for reproducible sampling.")
    weights: tuple[float, float, float] = Field(default=(0.5, 0.3, 0.2), description="FIDES fusion weights of (Opposition, Shift, Noise).")
    lambda_: float = Field(default=1.5, ge=0, description="FIDES λ: how strongly the fused score turns into contrast strength.")
    alpha_min: float = Field(default=0.1, ge=0, description="FIDES floor of the per-token contrast strength a_t.")
    shift_scale: float = Field(default=10.0, gt=0, description="FIDES divisor of the layer-averaged hidden-state shift.")
    noise_scale: float = Field(default=5.0, gt=0, description="FIDES divisor of the logit-lens KL.")
    noise_layer_ratio: float = Field(default=0.5, gt=0, lt=1, description="FIDES logit-lens layer = floor(ratio * L).")
    fixed_alpha: Optional[float] = Field(default=None, ge=0, description="Ablation: a constant a_t instead of the fused score.")
    use_chat_template: Optional[bool] = Field(
        default=None,
        description="Render prompts with the tokenizer's chat template (None: when it has one and no messages_to_prompt "
        "was given). It also makes is_chat_model true, so LlamaIndex picks its chat prompts.",
    )
    context_variables: list[str] = Field(
        default_factory=lambda: list(CONTEXT_VARIABLES),
        description="Template variables that hold retrieved text: emptied in the no-context path.",
    )
    context_separator: str = Field(default="\n\n", description="Joins documents (or simple_summarize's list of chunks) into one context.")
    chat_context_templates: list[str] = Field(
        default_factory=lambda: [DEFAULT_CONTEXT_TEMPLATE, DEFAULT_CONTEXT_PROMPT_TEMPLATE],
        description="System-message templates whose {context_str} is taken as the context when chat() gets "
        "already-rendered messages; the first also wraps chat(documents=...).",
    )
    history_size: int = Field(default=16, ge=0, description="How many recent generations `history` keeps.")
    strict: bool = Field(
        default=False,
        description="Raise FidesFallbackError instead of decoding with 'standard' when a call has no context to contrast "
        "(also per call: strict=True).",
    )
    max_batch_size: int = Field(
        default=8, ge=1, description="Most concurrent calls (async queries, acomplete, threads) decoded together in one batch."
    )
    batch_window_s: float = Field(
        default=0.005, ge=0, le=10, description="How long a call waits for concurrent calls to share its batch, in seconds."
    )

    _decoder: FidesDecoder = PrivateAttr()
    _custom_formatting: bool = PrivateAttr(default=False)
    _history: deque = PrivateAttr()
    _history_lock: threading.Lock = PrivateAttr()

    def __init__(
        self,
        decoder: FidesDecoder | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """Wrap `decoder`, or build one from `model` and `tokenizer` (see also `from_model_id`)."""
        if decoder is None:
            if model is None or tokenizer is None:
                raise TypeError("FidesLLM needs a FidesDecoder, or both model= and tokenizer= (or use FidesLLM.from_model_id)")
            decoder = FidesDecoder(model, tokenizer, max_new_tokens=kwargs.get("max_new_tokens", 128))
        elif not isinstance(decoder, FidesDecoder):
            raise TypeError(f"decoder must be a FidesDecoder, got {type(decoder).__name__}")
        elif model is not None or tokenizer is not None:
            raise TypeError("pass either decoder= or model= and tokenizer=, not both")
        if "model_name" not in kwargs:
            kwargs["model_name"] = str(getattr(decoder.model, "name_or_path", "") or "fides")
        for name, value in decoder.config.to_dict().items():  # the wrapped decoder's FIDES constants by default
            if name in type(self).model_fields and name not in kwargs:
                kwargs[name] = tuple(value) if name == "weights" else value
        kwargs.setdefault("max_new_tokens", decoder.max_new_tokens)
        custom = kwargs.get("messages_to_prompt") is not None or kwargs.get("completion_to_prompt") is not None
        super().__init__(**kwargs)
        self._decoder = decoder
        self._custom_formatting = custom
        self._history = deque(maxlen=self.history_size)
        self._history_lock = threading.Lock()
        if self.use_chat_template and not self._has_chat_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.fides_config()  # validate the FIDES constants now

    @classmethod
    def from_model_id(
        cls, model_id: str, *, device: str = "auto", dtype: Any = None, config: FidesConfig | None = None, **kwargs: Any
    ) -> FidesLLM:
        """Load a bundled alias ("gemma3-270m", "smollm2-135m-instruct"), hub id, folder or .gguf and wrap it.

        config: the FIDES constants, e.g. `FidesConfig.from_file("calibrated.json")` from `fides-rag calibrate`."""
        model, tokenizer = load_model(model_id, device=device, dtype=dtype)
        decoder = FidesDecoder(model, tokenizer, config=config, max_new_tokens=kwargs.get("max_new_tokens", 128))
        kwargs.setdefault("model_name", model_id)
        return cls(decoder, **kwargs)

    @classmethod
    def from_decoder(cls, decoder: FidesDecoder, **kwargs: Any) -> FidesLLM:
        """Share an already loaded decoder (one model can serve several FidesLLM objects)."""
        return cls(decoder, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "FidesLLM"

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in available_methods():
            raise ValueError(f"unknown method {value!r}; choose one of {available_methods()}")
        return value

    # -- properties ---------------------------------------------------------------------------------

    @property
    def decoder(self) -> FidesDecoder:
        return self._decoder

    @property
    def _has_chat_template(self) -> bool:
        return bool(getattr(self._decoder.tokenizer, "chat_template", None))

    @property
    def chat_template_active(self) -> bool:
        """Whether prompts go through the tokenizer's chat template."""
        if self.use_chat_template is not None:
            return self.use_chat_template
        return self._has_chat_template and not self._custom_formatting

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._decoder.context_window,
            num_output=self.max_new_tokens,
            model_name=self.model_name,
            is_chat_model=self.chat_template_active,
            is_function_calling_model=False,
            system_role=MessageRole.SYSTEM,
        )

    @property
    def last_result(self) -> GenerationResult | None:
        """The most recent GenerationResult of this LLM object (alphas, steps, prompts, notes)."""
        with self._history_lock:
            return self._history[-1]["result"] if self._history else None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Recent generations, oldest first: {"result": GenerationResult, "info": the additional_kwargs}."""
        with self._history_lock:
            return list(self._history)

    def fides_config(self) -> FidesConfig:
        return FidesConfig(
            weights=tuple(self.weights),
            lambda_=self.lambda_,
            alpha_min=self.alpha_min,
            shift_scale=self.shift_scale,
            noise_scale=self.noise_scale,
            noise_layer_ratio=self.noise_layer_ratio,
            fixed_alpha=self.fixed_alpha,
        )

    # -- prompts ------------------------------------------------------------------------------------

    def _messages_text(self, messages: Sequence[ChatMessage]) -> str:
        if self.chat_template_active:
            return render_messages(self._decoder.tokenizer, messages)
        return self.messages_to_prompt(messages)

    def _completion_text(self, prompt: str, formatted: bool) -> str:
        if formatted:
            return prompt
        if self.chat_template_active and not self._custom_formatting:
            return render_messages(self._decoder.tokenizer, self._extend_messages([ChatMessage(role=MessageRole.USER, content=prompt)]))
        return self.completion_to_prompt(prompt)

    def _render_template(self, prompt: BasePromptTemplate, args: dict[str, Any]) -> str:
        """The prompt LlamaIndex's own predict would build, through the chat template when active."""
        if self.chat_template_active:
            return self._messages_text(self._get_messages(prompt, **args))
        return self._get_prompt(prompt, **args)

    def _count(self, text: str) -> int:
        return len(self._decoder.tokenizer(text)["input_ids"])

    def _fit(self, render: Callable[[dict[str, str]], str], context: dict[str, str], max_new_tokens: int) -> tuple[str, dict[str, str], dict[str, Any]]:
        """Render the context path, trimming the longest context value until prompt + budget fits the window."""
        fitted = fit_texts(context, render, self._count, self._decoder.context_window - max_new_tokens, self._decoder.tokenizer)
        if not fitted.trimmed:
            return fitted.rendered, fitted.texts, {}
        note = fitted.note(max_new_tokens, self._decoder.context_window)
        trim = {"notes": [note], "documents_trimmed": True, "document_tokens": (fitted.tokens_before, fitted.tokens_after)}
        return fitted.rendered, fitted.texts, trim

    def _template_pair(self, prompt: BasePromptTemplate, template_args: dict[str, Any], max_new_tokens: int) -> _Pair:
        context = find_context(prompt, template_args, self.context_variables, self, self.context_separator)
        info: dict[str, Any] = {"prompt_type": prompt_type(prompt, self), "context_variables": sorted(context)}
        if is_fides_rag_template(prompt):
            known = {**(getattr(prompt, "kwargs", None) or {}), **template_args}
            question = str(known.get("query_str", ""))
            texts = [t for t in context.values() if t.strip()]
            info["prompt_type"] = "fides_rag"
            fallback = None if texts else "the retrieved context (context_str) was empty"
            return _Pair("", None, info, question=question, documents=texts, fallback=fallback)
        if not any(v.strip() for v in context.values()):
            what = "was empty" if context else "is not in the prompt"
            why = f"the context variable ({', '.join(self.context_variables)}) {what}"
            return _Pair(self._render_template(prompt, {**template_args, **context}), None, info, fallback=why)
        ctx_text, used, trim = self._fit(lambda c: self._render_template(prompt, {**template_args, **c}), context, max_new_tokens)
        no_ctx_text = self._render_template(prompt, {**template_args, **{k: "" for k in context}})
        info.update(trim)
        info["context"] = self.context_separator.join(used.values())
        return _Pair(ctx_text, no_ctx_text, info)

    def _documents_pair(self, query: str, documents: Any) -> _Pair:
        """complete(query, documents=...): fides-rag's own 2-shot template (as langchain-fides' documents=)."""
        texts = document_texts(documents)
        fallback = None if texts else "the documents given were empty"
        return _Pair("", None, {"prompt_type": "fides_rag", "context_variables": []}, question=query, documents=texts, fallback=fallback)

    def _chat_pair(self, messages: Sequence[ChatMessage], documents: Any, max_new_tokens: int) -> _Pair:
        check_has_user_message(messages)
        if documents is not None and len(messages) == 1 and not self.system_prompt:
            # One question: fides-rag's template, as complete(documents=) and langchain-fides' ChatFides.
            return self._documents_pair(messages[0].content or "", documents)
        messages = self._extend_messages(list(messages))
        template = self.chat_context_templates[0] if self.chat_context_templates else DEFAULT_CONTEXT_TEMPLATE
        if documents is not None:
            context = self.context_separator.join(document_texts(documents))
            if context.strip():
                render = lambda c: self._messages_text(with_context_message(messages, template, c["context_str"]))  # noqa: E731
                ctx_text, used, trim = self._fit(render, {"context_str": context}, max_new_tokens)
                info = {"prompt_type": "chat", "context_variables": ["context_str"], "context": used["context_str"], **trim}
                return _Pair(ctx_text, render({"context_str": ""}), info)
        found = split_context_from_messages(messages, self.chat_context_templates)
        if found is not None:
            emptied, context = found
            info = {"prompt_type": "chat", "context_variables": ["system message"], "context": context}
            return _Pair(self._messages_text(messages), self._messages_text(emptied), info)
        why = "the documents given were empty" if documents is not None else "no documents= and no context system message in the chat"
        return _Pair(self._messages_text(messages), None, {"prompt_type": "chat"}, fallback=why)

    # -- decoding -----------------------------------------------------------------------------------

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(kwargs) - set(CALL_OPTIONS)
        if unknown:
            raise TypeError(f"FidesLLM got unsupported keyword argument(s) {sorted(unknown)}; supported: {list(CALL_OPTIONS)}")
        options = {name: getattr(self, name) for name in GENERATION_OPTIONS}
        options.update({k: v for k, v in kwargs.items() if k in GENERATION_OPTIONS})
        options["strict"] = kwargs.get("strict", self.strict)
        if not isinstance(options["strict"], bool):
            raise TypeError(f"strict must be True or False, got {options['strict']!r}")
        if options["method"] not in available_methods() and not hasattr(options["method"], "combine"):
            raise ValueError(f"unknown method {options['method']!r}; choose one of {available_methods()}")
        return options

    def _check_fallback(self, pair: _Pair, options: dict[str, Any]) -> None:
        """Raise under strict mode, else log a warning, when a contrastive method has no context to contrast."""
        requested = options["method"] if isinstance(options["method"], str) else getattr(options["method"], "name", "custom")
        if pair.fallback is None or requested == "standard":
            return
        if options["strict"]:
            raise FidesFallbackError(
                f"strict=True: {pair.fallback}, so method {requested!r} has nothing to contrast. Pass documents=[...], "
                f"give the prompt a non-empty context_str/context_msg, or set strict=False to decode with 'standard' "
                f"(logged and recorded in the response's notes)"
            )
        logger.warning(pair.info["notes"][0])

    @property
    def _batcher(self) -> RequestBatcher:
        """The request batcher every LLM on this decoder shares: concurrent calls decode together."""
        return shared_batcher(self._decoder, max_batch_size=self.max_batch_size, window_s=self.batch_window_s)

    def _decode_args(self, pair: _Pair, options: dict[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
        self._check_fallback(pair, options)
        method = options["method"]
        rule: Any = get_method(method, config=self.fides_config()) if isinstance(method, str) and accepts_option(method, "config") else method
        if pair.fallback is not None:
            rule = "standard"
        args = {k: v for k, v in options.items() if k not in ("method", "strict")}
        if not args["do_sample"]:  # sampling knobs would only warn under greedy decoding
            args.update(temperature=1.0, top_p=1.0, top_k=0)
        args["method"] = rule
        if pair.uses_template:
            stops = list(args["stop"] or [])
            args["stop"] = stops + [s for s in template_stops(self._decoder.prompt_template) if s not in stops]
            return (pair.question or "", pair.documents or []), args
        no_ctx = pair.no_context_prompt if pair.no_context_prompt is not None else pair.context_prompt
        return (pair.context_prompt, no_ctx), args

    def _clean(self, pair: _Pair, result: GenerationResult) -> GenerationResult:
        """fides-rag's template: drop template leftovers ("Document [2]:") from the answer, with a note."""
        if not pair.uses_template:
            return result
        text, notes = TemplateLeftovers(self._decoder.prompt_template).clean(result.text, truncated=result.finish_reason == "length")
        return dataclasses.replace(result, text=text, notes=[*result.notes, *notes]) if notes else result

    def _report(self, pair: _Pair, options: dict[str, Any], result: GenerationResult) -> dict[str, Any]:
        requested = options["method"] if isinstance(options["method"], str) else getattr(options["method"], "name", "custom")
        info = {
            "method": result.method,
            "requested_method": requested,
            "alphas": result.alphas,
            "steps": [s.to_dict() for s in result.steps],
            "finish_reason": result.finish_reason,
            "notes": list(dict.fromkeys([*pair.info.get("notes", []), *result.notes])),
            "documents_trimmed": bool(pair.info.get("documents_trimmed", False)),
            "document_tokens": pair.info.get("document_tokens"),
            "prompt_type": pair.info.get("prompt_type"),
            "context_variables": pair.info.get("context_variables", []),
            "context_prompt": result.context_prompt if pair.uses_template else pair.context_prompt,
            "no_context_prompt": result.no_context_prompt if pair.uses_template else pair.no_context_prompt,
        }
        if pair.uses_template:
            info["documents_trimmed"] = bool(result.documents_trimmed)
            info["document_tokens"] = result.document_tokens
        with self._history_lock:
            self._history.append({"result": result, "info": info})
        return info

    def _pair_for_complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any], options: dict[str, Any]) -> _Pair:
        documents, no_ctx = kwargs.get("documents"), kwargs.get("no_context_prompt")
        if no_ctx is not None:
            if documents is not None:
                raise TypeError("pass documents= or no_context_prompt=, not both")
            return _Pair(prompt if formatted else self._completion_text(prompt, False), no_ctx, {"prompt_type": "explicit"})
        if documents is not None:
            return self._documents_pair(prompt, documents)
        return _Pair(self._completion_text(prompt, formatted), None, {"prompt_type": "completion"}, fallback="no documents= were given")

    def _generate(self, pair: _Pair, options: dict[str, Any]) -> CompletionResponse:
        prompts, args = self._decode_args(pair, options)
        if pair.uses_template:
            result = self._clean(pair, self._batcher.generate(*prompts, **args))
        else:
            result = self._batcher.generate(context_prompt=prompts[0], no_context_prompt=prompts[1], **args)
        info = self._report(pair, options, result)
        return CompletionResponse(text=result.text, raw=result.to_dict(), additional_kwargs=info)

    def _stream(self, pair: _Pair, options: dict[str, Any]) -> CompletionResponseGen:
        prompts, args = self._decode_args(pair, options)
        if pair.uses_template:
            stream = self._batcher.stream(*prompts, **args)
        else:
            stream = self._batcher.stream(context_prompt=prompts[0], no_context_prompt=prompts[1], **args)
        leftovers = TemplateLeftovers(self._decoder.prompt_template) if pair.uses_template else None
        raw, text, held = "", "", None  # one delta is held back so that the last response can carry the signals
        try:
            for delta in stream:
                if leftovers is not None:  # stream only what cannot turn out to be a template leftover
                    raw += delta
                    visible = leftovers.visible(raw)
                    if not (len(visible) > len(text + (held or "")) and visible.startswith(text + (held or ""))):
                        continue
                    delta = visible[len(text + (held or "")) :]
                if held is not None:
                    text += held
                    yield CompletionResponse(text=text, delta=held)
                held = delta
        finally:
            stream.close()
        assert stream.result is not None
        result = self._clean(pair, stream.result)
        info = self._report(pair, options, result)
        pending = held or ""
        if result.text.startswith(text + pending) and len(result.text) > len(text + pending):  # a held-back tail
            pending = result.text[len(text) :]
        yield CompletionResponse(text=text + pending, delta=pending, raw=result.to_dict(), additional_kwargs=info)

    # -- LlamaIndex hooks: completion ---------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Decode `prompt`. kwargs: documents=[...] (contrastive path), no_context_prompt=str, and any of
        method, max_new_tokens, stop, do_sample, temperature, top_p, top_k, seed."""
        pair = kwargs.pop("_pair", None)
        options = self._options(kwargs)
        pair = pair or self._pair_for_complete(prompt, formatted, kwargs, options)
        return self._generate(pair, options)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        pair = kwargs.pop("_pair", None)
        options = self._options(kwargs)
        pair = pair or self._pair_for_complete(prompt, formatted, kwargs, options)
        return self._stream(pair, options)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        pair = kwargs.pop("_pair", None)
        options = self._options(kwargs)
        pair = pair or self._pair_for_complete(prompt, formatted, kwargs, options)
        return await _in_thread(self._generate, pair, options)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        pair = kwargs.pop("_pair", None)
        options = self._options(kwargs)
        pair = pair or self._pair_for_complete(prompt, formatted, kwargs, options)
        return _thread_stream(lambda: self._stream(pair, options))

    # -- LlamaIndex hooks: chat ---------------------------------------------------------------------

    def _chat_inputs(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> tuple[_Pair, dict[str, Any]]:
        if "no_context_prompt" in kwargs:
            raise TypeError("chat does not take no_context_prompt=; use complete(..., no_context_prompt=...)")
        options = self._options(kwargs)
        return self._chat_pair(messages, kwargs.get("documents"), options["max_new_tokens"]), options

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Chat; the context is documents=[...], or a system message rendered from a chat_context_templates entry."""
        pair, options = self._chat_inputs(messages, kwargs)
        return _to_chat(self._generate(pair, options))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        pair, options = self._chat_inputs(messages, kwargs)
        return (_to_chat(r) for r in self._stream(pair, options))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        pair, options = self._chat_inputs(messages, kwargs)
        return _to_chat(await _in_thread(self._generate, pair, options))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        pair, options = self._chat_inputs(messages, kwargs)

        async def gen() -> ChatResponseAsyncGen:
            async for response in _thread_stream(lambda: self._stream(pair, options)):
                yield _to_chat(response)

        return gen()

    # -- LlamaIndex hooks: prompt templates (query engines, response synthesizers, chat engines) ----

    @dispatcher.span
    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        """Context path: the prompt as formatted; no-context path: the same with context_str/context_msg emptied.

        prompt_args may also carry per-call options that the template does not use (method, max_new_tokens, ...).
        """
        pair, options = self._predict_pair(prompt, prompt_args)
        response = self.complete(pair.context_prompt, formatted=True, _pair=pair, **_call_kwargs(options))
        output = self._parse_output(response.text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        if prompt.output_parser is not None or self.output_parser is not None:
            raise NotImplementedError("Output parser is not supported for streaming.")
        pair, options = self._predict_pair(prompt, prompt_args)
        responses = self.stream_complete(pair.context_prompt, formatted=True, _pair=pair, **_call_kwargs(options))
        return stream_completion_response_to_tokens(responses)

    @dispatcher.span
    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        pair, options = self._predict_pair(prompt, prompt_args)
        response = await self.acomplete(pair.context_prompt, formatted=True, _pair=pair, **_call_kwargs(options))
        output = self._parse_output(response.text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        if prompt.output_parser is not None or self.output_parser is not None:
            raise NotImplementedError("Output parser is not supported for streaming.")
        pair, options = self._predict_pair(prompt, prompt_args)
        responses = await self.astream_complete(pair.context_prompt, formatted=True, _pair=pair, **_call_kwargs(options))
        return await astream_completion_response_to_tokens(responses)

    def _predict_pair(self, prompt: BasePromptTemplate, prompt_args: dict[str, Any]) -> tuple[_Pair, dict[str, Any]]:
        template_args, call = split_prompt_args(prompt, prompt_args, CALL_OPTIONS)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=template_args))
        self._log_template_data(prompt, **template_args)
        if "documents" in call or "no_context_prompt" in call:
            raise TypeError("predict takes its context from the template variables (context_str/context_msg), not documents=")
        options = self._options(call)
        return self._template_pair(prompt, template_args, options["max_new_tokens"]), call


def _call_kwargs(call: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in call.items() if k in GENERATION_OPTIONS or k == "strict"}


def _to_chat(response: CompletionResponse) -> ChatResponse:
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, content=response.text),
        delta=response.delta,
        raw=response.raw,
        additional_kwargs=response.additional_kwargs,
    )


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking decoding in a worker thread so the event loop stays free."""
    return await asyncio.to_thread(fn, *args)


def _thread_stream(make: Callable[[], Iterator[Any]]) -> AsyncGenerator[Any, None]:
    """An async generator fed by a sync generator running in a worker thread through an asyncio queue."""

    async def gen() -> AsyncGenerator[Any, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        done = object()

        def put(item: Any, error: BaseException | None = None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (item, error))
            except RuntimeError:  # the loop is closed: the consumer went away
                cancelled.set()

        def produce() -> None:
            try:
                iterator = make()
                try:
                    for item in iterator:
                        put(item)
                        if cancelled.is_set():
                            break
                finally:
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
                put(done)
            except BaseException as error:  # handed to the consumer
                put(done, error)

        context = contextvars.copy_context()
        worker = threading.Thread(target=context.run, args=(produce,), daemon=True, name="fides-llm-stream")
        worker.start()
        try:
            while True:
                item, error = await queue.get()
                if error is not None:
                    raise error
                if item is done:
                    return
                yield item
        finally:
            cancelled.set()

    return gen()
