"""The dual-path decoder's public API: `generate`, `generate_batch` and `stream` (and `agenerate`, `astream`).

Each call builds its requests with the one request builder (`generation/requests.py`) and decodes them on the
decoder's one continuous-batching engine (`generation/engine/engine.py`), which every other entry point shares: calls
from several threads or tasks (`submit` queues one and returns its future), the framework integrations and the
server decode together. Each step:
one forward of every row of every request (context, no-context, per-document, masked-heads paths), one
output-head matmul, each rule's `combine`, a token chosen per request, and one device-to-host transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

from fides_rag.errors import NonFiniteLogitsError, QueueFullError
from fides_rag.generation.engine.attention import attention_choices
from fides_rag.generation.engine.engine import DecodeEngine
from fides_rag.generation.engine.forward_timer import ForwardTimer
from fides_rag.generation.engine.modes import MODES, Mode, check_mode_settings
from fides_rag.generation.engine.scheduler import MIN_BATCHED_TOKENS, check_batched_tokens
from fides_rag.generation.engine.tickets import RequestHandle
from fides_rag.generation.engine.views import DecoderLimits, DecoderStats
from fides_rag.generation.options import MethodOptions
from fides_rag.generation.prompting import PreparedExample, PromptPreparer, context_window
from fides_rag.generation.requests import PromptPair, RequestBuilder
from fides_rag.generation.settings import GenerationSettings
from fides_rag.generation.streaming import AsyncTextStream, TextStream
from fides_rag.prompts.template import PromptTemplate
from fides_rag.rules import ContrastRule, get_method

_MODE_SETTINGS = ("compile", "buckets", "warmup", "kv_pool_tokens", "kv_cache_memory")
"""The engine settings that apply in one mode only (`check_mode_settings`)."""

__all__ = [
    "MIN_BATCHED_TOKENS",
    "AsyncTextStream",
    "DecoderLimits",
    "DecoderStats",
    "FidesDecoder",
    "ForwardTimer",
    "GenerationSettings",
    "NonFiniteLogitsError",
    "PreparedExample",
    "PromptPair",
    "QueueFullError",
    "RequestHandle",
    "TextStream",
    "attention_choices",
    "check_batched_tokens",
]

Prompt = str | PromptPair | PreparedExample


class FidesDecoder:
    """Dual-path contrastive decoding (FIDES and its baselines) on a Hugging Face causal LM.

    >>> model, tokenizer = load_model("gemma3-270m")
    >>> decoder = FidesDecoder(model, tokenizer, method="fides")
    >>> decoder.generate("What is the capital of France?", ["Lyon is the capital of France."]).text
    >>> decoder.generate(PromptPair(context="...", no_context="..."), method="cad")
    >>> decoder.generate_batch(questions, documents, methods=["standard", "cad", "fides"])   # label -> results
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        method: str | ContrastRule = "fides",
        config: Any = None,
        *,
        prompt_template: PromptTemplate | None = None,
        use_chat_template: bool | None = None,
        max_new_tokens: int = 128,
        split_prefill: bool = True,
        warmup: bool | Sequence[str | ContrastRule] = False,
        **engine_settings: Any,
    ) -> None:
        """`config`: a convenience for `method=get_method(method, config=config)` (e.g. a FidesConfig).
        `engine_settings`: max_requests, max_rows, max_tokens, max_queue, window_s, admission,
        max_num_batched_tokens (see `configure`), prefix_caching, prefix_cache_bytes, and mode: "exact" (the CPU's
        default: a greedy request's tokens do not depend on what else is in flight) or "fast" (the default elsewhere:
        one attention call per layer over every row); read back from `limits.mode`; attention: the decode step's
        backend ("auto", the default: ragged in exact mode, flex on CUDA, gather elsewhere; read back from
        `limits.attention`); compile (True or a torch.compile backend name: fast mode's decode step captured per batch
        bucket), buckets; in fast mode kv_pool_tokens (the KV pool's positions) or kv_cache_memory (its bytes, or on
        CUDA a fraction of free device memory) size the fixed pool, read back from `stats.kv_pool_tokens`.
        `warmup`: with `compile`, compile every bucket at start-up (a progress bar; `stats.warmup_s` says how long) with
        the hooks of the decoder's method and 'standard' (True), or of each method of a list; after it, a step that
        would recompile runs eagerly instead (counted in `stats.captured_fallback_steps`)."""
        if config is not None:
            if not isinstance(method, str):
                raise ValueError(
                    "config= configures a method given by name; pass a configured rule object alone instead"
                )
            method = get_method(method, config=config)
        rule = get_method(method)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        GenerationSettings(max_new_tokens=max_new_tokens)
        if isinstance(warmup, (list, tuple)) and warmup:
            warmup = [get_method(m) for m in warmup]  # unknown names are refused here
        elif not isinstance(warmup, bool):
            raise ValueError(
                f"warmup must be True, False or a non-empty list of methods (names or rules), got {warmup!r}"
            )
        self._engine = DecodeEngine(model, tokenizer, split_prefill=split_prefill, warmup=warmup, **engine_settings)
        preparer = PromptPreparer(
            tokenizer,
            prompt_template or PromptTemplate(),
            has_template if use_chat_template is None else use_chat_template,
            context_window(model.config, tokenizer),
        )
        self._requests = RequestBuilder(
            preparer,
            rule,
            max_new_tokens,
            self._engine.setup_heads,
            vocab_size=self._engine.vocab_size,
            eos_token_ids=lambda: self._engine.eos_token_ids,
        )
        """The request builder every entry point on this decoder shares."""
        if warmup is not False:
            self._warm_up([rule, "standard"] if warmup is True else list(warmup))

    def _warm_up(self, methods: list[str | ContrastRule]) -> None:
        distinct = {get_method(m).name: m for m in methods}
        self._engine.warm_up(
            lambda m: self._requests.build("warm-up", ["warm-up"], method=m, max_new_tokens=3, min_new_tokens=3),
            list(distinct.values()),
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str = "auto",
        dtype: Any = None,
        device_map: Any = None,
        offload_folder: str | None = None,
        **kwargs: Any,
    ) -> FidesDecoder:
        """Load a model with `load_model` (`device_map="auto"` splits it over the available devices, offloading
        what does not fit to `offload_folder`) and wrap it; `kwargs` go to the decoder."""
        from fides_rag.models.loading import load_model, select_device

        if device_map is None:  # a setting the mode would ignore is refused before minutes of loading
            mode = kwargs.get("mode") or ("exact" if select_device(device).type == "cpu" else "fast")
            if mode in MODES:
                check_mode_settings(cast(Mode, mode), **{k: v for k, v in kwargs.items() if k in _MODE_SETTINGS})
        load_kwargs: dict[str, Any] = {"offload_folder": offload_folder} if offload_folder is not None else {}
        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype, device_map=device_map, **load_kwargs)
        return cls(model, tokenizer, **kwargs)

    # -- what the decoder holds ------------------------------------------------------------------

    @property
    def model(self) -> PreTrainedModel:
        return self._engine.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._engine.tokenizer

    @property
    def method(self) -> ContrastRule:
        """The default rule (`method=None`)."""
        return self._requests.default_method

    @property
    def max_new_tokens(self) -> int:
        """The default budget (`max_new_tokens=None`)."""
        return self._requests.default_max_new_tokens

    @property
    def prompts(self) -> PromptPreparer:
        """The prompt preparer: renders fides-rag's template and tokenises prompts (questions and documents as plain
        text);
        `template`, `use_chat_template` and `context_window` are its settings."""
        return self._requests.preparer

    @property
    def device(self) -> torch.device:
        """Where input ids go: the input embeddings' device (the CPU when they are offloaded)."""
        return self._engine.input_device

    @property
    def eos_token_ids(self) -> set[int]:
        return self._engine.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: set[int]) -> None:
        self._engine.eos_token_ids = set(ids)

    @property
    def limits(self) -> DecoderLimits:
        """The engine's bounds as they are now (max_queue, max_requests, max_rows, max_tokens, max_num_batched_tokens,
        window_s, admission, context_window, split_prefill, prefix_cache_bytes); `configure` changes the scheduler's."""
        return self._engine.limits()

    @property
    def stats(self) -> DecoderStats:
        """The engine's counters as they are now: requests, steps, tokens, peak queue, cancellations, what is in flight
        (queue_length, requests_in_flight, rows_in_flight) and the prefix cache's hits, misses and bytes."""
        return self._engine.snapshot()

    def rule_for(self, method: str | ContrastRule | None) -> ContrastRule:
        """The rule a call's `method=` runs on this decoder: None or the default rule's name gives the configured
        default
        (behind a gate with `name+gate`), any other name a fresh rule with its defaults; a rule object is itself."""
        return self._requests.resolve(method)

    def prepare(
        self, question: str, documents: Any, max_new_tokens: int, *, document_paths: bool = False
    ) -> PreparedExample:
        """Render and tokenise both branches of one example as `generate` would (e.g. to count its prompt tokens);
        `generate` and `generate_batch` also take the result."""
        return self._requests.preparer.prepare(question, documents, max_new_tokens, document_paths=document_paths)

    # -- decoding ---------------------------------------------------------------------------------

    def configure(self, **engine_settings: Any) -> None:
        """Change the engine's settings (max_requests, max_rows, max_tokens, max_queue: None for no bound; window_s,
        admission ('continuous' or 'static'), max_num_batched_tokens); every caller of this decoder shares them, and
        `limits` reads them back."""
        self._engine.configure(**engine_settings)

    @contextlib.contextmanager
    def around_steps(self, step_context: Callable[[], AbstractContextManager]) -> Iterator[None]:
        """While open, every engine step runs inside `step_context()` on the decoding thread (profilers, torch modes,
        sync counters); the previous one is restored on leaving."""
        previous, self._engine.step_context = self._engine.step_context, step_context
        try:
            yield
        finally:
            self._engine.step_context = previous

    @contextlib.contextmanager
    def around_forwards(self, forward_context: Callable[[], AbstractContextManager]) -> Iterator[None]:
        """While open, every decode step's backbone forward alone (a captured step's graph replay, or the eager
        forward) runs inside `forward_context()`: a `ForwardTimer` splits the forward's device time from the step's;
        the previous one is restored on leaving."""
        previous, self._engine.forward_context = self._engine.forward_context, forward_context
        try:
            yield
        finally:
            self._engine.forward_context = previous

    def submit(
        self,
        question: Prompt,
        documents: Sequence[Any] | None = None,
        *,
        stream: bool = False,
        wait_here: bool = False,
        **options: Unpack[MethodOptions],
    ) -> RequestHandle:
        """Queue one request from any thread and return its future at once: `result()` waits for the
        GenerationResult, `cancel()` drops the request, `.future` is a `concurrent.futures.Future` (for
        `asyncio.wrap_future`), and with `stream=True` its deltas arrive on `stream()` / `astream()`. Bad input
        raises here, before anything decodes; concurrent requests decode together. `wait_here`: the caller will
        wait on `result()` and decodes on its own thread while no other thread does."""
        return self._engine.submit(
            [self._requests.build(question, documents, stream=stream, **options)], wait_here=wait_here
        )[0]

    def generate(
        self, question: Prompt, documents: Sequence[Any] | None = None, **options: Unpack[MethodOptions]
    ) -> Any:
        """Answer `question` with its `documents`, or a `PromptPair` (or a `PreparedExample` from `prepare`).

        options: method (or methods, for label -> result), max_new_tokens, stop, do_sample, temperature, top_p,
        top_k, seed, min_new_tokens, logits_processor, stopping_criteria (`MethodOptions`)."""
        request = self._requests.build(question, documents, **options)
        return self._engine.submit([request], wait_here=True)[0].result()

    def generate_batch(
        self,
        questions: Sequence[Prompt],
        documents_per_question: Sequence[Any] | None = None,
        **options: Unpack[MethodOptions],
    ) -> Any:
        """Answer several questions (or PromptPairs) together: one result each, or with `methods` label -> one result
        per question. Every request is built, and bad input refused, before any decodes."""
        requests = self._requests.build_all(questions, documents_per_question, **options)
        handles = self._engine.submit(requests, wait_here=True)
        try:
            results = [h.result() for h in handles]
        finally:
            for handle in handles:
                handle.cancel()  # after an error: the rest leave the batch (a no-op for finished ones)
        if options.get("methods") is None:
            return results
        return {label: [r[label] for r in results] for label in results[0]} if results else {}

    def stream(
        self, question: Prompt, documents: Sequence[Any] | None = None, **options: Unpack[MethodOptions]
    ) -> TextStream:
        """Text deltas as they are decoded; their concatenation equals the final `result.text`. Any thread may
        read it; closing it cancels the request."""
        request = self._requests.build(question, documents, stream=True, **options)
        return self._engine.submit([request])[0].stream()

    async def agenerate(
        self, question: Prompt, documents: Sequence[Any] | None = None, **options: Unpack[MethodOptions]
    ) -> Any:
        """`generate` for asyncio: the event loop stays free, and cancelling the task cancels the request."""
        request = self._requests.build(question, documents, **options)
        return await asyncio.wrap_future(self._engine.submit([request])[0].future)

    def astream(
        self, question: Prompt, documents: Sequence[Any] | None = None, **options: Unpack[MethodOptions]
    ) -> AsyncTextStream:
        """`stream` as an async iterator; cancelling the task that reads it cancels the request."""
        request = self._requests.build(question, documents, stream=True, **options)
        return self._engine.submit([request])[0].astream()

    def decode_text(self, token_ids: list[int]) -> str:
        """Generated ids as text (special tokens dropped, spacing kept as generated)."""
        return self._engine.decode_text(token_ids)
