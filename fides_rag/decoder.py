"""The dual-path decoder's public API: every path of every example, under every method, in one forward
call per step (the loop itself is `generation/loop.py`).

Each step: the backbone runs once over all rows (context, no-context, per-document, masked-heads copies:
see `generation/layout.py`), one output-head matmul covers every row's final state and the logit-lens rows,
each rule's `combine` turns its lane's paths into scores, a token is chosen per unit, and finished rows
leave the KV cache. Per step, exactly one device-to-host transfer: the chosen ids (with the NaN/inf flags
and stopping-criteria verdicts packed beside them). The rooms: `generation/` settings, prompting, layout,
gather, kv_cache, hooks, choosing, stopping, streaming, results, validation, loop and run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

from fides_rag.generation.choosing import NonFiniteLogitsError
from fides_rag.generation.layout import Unit
from fides_rag.generation.loop import decode_loop
from fides_rag.generation.options import GenerationOptions, MethodOptions, RawPromptOptions
from fides_rag.generation.prompting import PreparedExample, PromptPreparer, context_window
from fides_rag.generation.results import assemble
from fides_rag.generation.run import DecodeRun
from fides_rag.generation.settings import GenerationSettings, RowSettings
from fides_rag.generation.stopping import first_stop_index
from fides_rag.generation.streaming import AsyncTextStream, DeltaTracker, TextStream
from fides_rag.generation.validation import check_document_paths, refuse_document_paths
from fides_rag.lens import ModelAnatomy
from fides_rag.prompts import PromptTemplate
from fides_rag.result import GenerationResult
from fides_rag.rules import ContrastRule, get_method
from fides_rag.rules.base import DOCUMENTS, MASKED_HEADS

__all__ = [
    "AsyncTextStream", "FidesDecoder", "GenerationSettings", "NonFiniteLogitsError", "PreparedExample", "TextStream",
    "first_stop_index",
]

Heads = dict[int, tuple[int, ...]]


class FidesDecoder:
    """Dual-path contrastive decoding (FIDES and its baselines) on a Hugging Face causal LM.

    >>> model, tokenizer = load_model("gemma3-270m")
    >>> decoder = FidesDecoder(model, tokenizer, method="fides")
    >>> decoder.generate("What is the capital of France?", documents=["Lyon is the capital of France."]).text
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
    ) -> None:
        """`config`: a convenience for `method=get_method(method, config=config)` (e.g. a FidesConfig)."""
        self.model = model
        self.tokenizer = tokenizer
        self.anatomy = ModelAnatomy.of(model)
        if config is not None:
            if not isinstance(method, str):
                raise ValueError("config= configures a method given by name; pass a configured rule object alone instead")
            method = get_method(method, config=config)
        self.method = get_method(method)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        GenerationSettings(max_new_tokens=max_new_tokens)
        self.max_new_tokens = max_new_tokens
        self.prompts = PromptPreparer(
            tokenizer, prompt_template or PromptTemplate(), has_template if use_chat_template is None else use_chat_template,
            context_window(model.config, tokenizer),
        )
        self.eos_token_ids = self._collect_eos_ids()
        self.split_prefill = split_prefill
        """Encode each path's prompt in its own forward (exact; saves the no-context path's padding)."""
        self._lock = threading.RLock()

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str = "auto", dtype: Any = None, device_map: Any = None,
        offload_folder: str | None = None, **kwargs: Any
    ) -> FidesDecoder:
        """Load a model with `load_model` (`device_map="auto"` splits it over the available devices, offloading
        what does not fit to `offload_folder`) and wrap it; `kwargs` go to the decoder."""
        from fides_rag.loading import load_model

        load_kwargs = {"offload_folder": offload_folder} if offload_folder is not None else {}
        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype, device_map=device_map, **load_kwargs)
        return cls(model, tokenizer, **kwargs)

    # -- setup ----------------------------------------------------------------------------------

    @property
    def prompt_template(self) -> PromptTemplate:
        return self.prompts.template

    @property
    def use_chat_template(self) -> bool:
        return self.prompts.use_chat_template

    @property
    def context_window(self) -> int:
        return self.prompts.context_window

    @property
    def config(self) -> Any:
        """The configuration object of the decoder's default rule (FIDES's FidesConfig), or None."""
        return getattr(self.method, "config", None)

    @property
    def device(self) -> torch.device:
        """Where input ids go: the input embeddings' device (the CPU when they are offloaded)."""
        weight = self.model.get_input_embeddings().weight
        return torch.device("cpu") if weight.device.type == "meta" else weight.device

    def resolve_method(self, method: str | ContrastRule | None) -> ContrastRule:
        """A rule object for `method`. None, or the default rule's name, gives the decoder's configured rule."""
        if method is None or (isinstance(method, str) and method == self.method.name):
            return self.method
        return get_method(method)

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        sources = (
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(getattr(self.model, "generation_config", None), "eos_token_id", None),
            getattr(self.model.config, "eos_token_id", None),
        )
        for value in sources:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    # -- prompts --------------------------------------------------------------------------------

    def prepare(self, question: str, documents: Any, max_new_tokens: int, *, document_paths: bool = False) -> PreparedExample:
        """Render and tokenise both branches of one example (see `PromptPreparer.prepare`)."""
        return self.prompts.prepare(question, documents, max_new_tokens, document_paths=document_paths)

    def prepare_from_prompts(
        self, context_prompt: str, no_context_prompt: str, max_new_tokens: int, add_special_tokens: bool = True
    ) -> PreparedExample:
        """Tokenise two raw prompts (see `PromptPreparer.prepare_from_prompts`)."""
        return self.prompts.prepare_from_prompts(context_prompt, no_context_prompt, max_new_tokens, add_special_tokens)

    def _prepare_all(
        self, questions: Sequence[str], documents_per_question: Sequence[Any] | None, rules: Sequence[ContrastRule], settings: GenerationSettings
    ) -> list[PreparedExample]:
        if isinstance(questions, str):
            raise TypeError("pass a list of questions; use generate for a single question")
        if documents_per_question is None:
            documents_per_question = [None] * len(questions)
        if len(documents_per_question) != len(questions):
            raise ValueError(
                f"got {len(questions)} questions but {len(documents_per_question)} document lists; pass one list per question"
            )
        document_paths = any(DOCUMENTS in rule.paths for rule in rules)
        return [
            self.prepare(q, d, settings.max_new_tokens, document_paths=document_paths)
            for q, d in zip(questions, documents_per_question)
        ]

    # -- public API -------------------------------------------------------------------------------

    def generate(
        self,
        question: str,
        documents: Sequence[Any] | None = None,
        **options: Unpack[MethodOptions],
    ) -> GenerationResult:
        """Answer `question` from `documents` with `method` (default: the decoder's).

        options: method, max_new_tokens, stop, do_sample, temperature, top_p, top_k, seed, min_new_tokens,
        logits_processor, stopping_criteria (`MethodOptions`).
        """
        return self.generate_batch([question], [documents], **options)[0]

    def generate_batch(
        self,
        questions: Sequence[str],
        documents_per_question: Sequence[Sequence[Any] | None] | None = None,
        **options: Unpack[MethodOptions],
    ) -> list[GenerationResult]:
        """Answer several questions in one batched decode (all paths of all examples in one forward per step)."""
        rule, settings = self._method_and_settings(options)
        examples = self._prepare_all(questions, documents_per_question, [rule], settings)
        return self._decode_examples(examples, [rule], settings)[0]

    def generate_methods(
        self,
        questions: Sequence[str],
        documents_per_question: Sequence[Sequence[Any] | None] | None,
        methods: Sequence[str | ContrastRule] | Mapping[str, str | ContrastRule],
        **options: Unpack[GenerationOptions],
    ) -> dict[str, list[GenerationResult]]:
        """Answer every question under every method in one decode that shares the prompts' prefill.

        `methods` is a list of names/rules, or a mapping label -> name/rule (needed when two configured
        rules share a name, e.g. FIDES ablations). Returns label -> one result per question, each identical
        to what `generate_batch` gives for that method alone.
        """
        labelled = self._labelled_rules(methods)
        settings = GenerationSettings.build(self.max_new_tokens, options)
        examples = self._prepare_all(questions, documents_per_question, list(labelled.values()), settings)
        return dict(zip(labelled, self._decode_examples(examples, list(labelled.values()), settings)))

    def generate_prepared_methods(
        self,
        examples: Sequence[PreparedExample],
        methods: Sequence[str | ContrastRule] | Mapping[str, str | ContrastRule],
        **options: Unpack[GenerationOptions],
    ) -> dict[str, list[GenerationResult]]:
        """`generate_methods` for examples from `prepare` / `prepare_from_prompts` (e.g. a framework's prompt pairs):
        every method over one shared prefill; label -> one result per example, each equal to `generate_prepared`'s."""
        labelled = self._labelled_rules(methods)
        settings = GenerationSettings.build(self.max_new_tokens, options)
        return dict(zip(labelled, self._decode_examples(list(examples), list(labelled.values()), settings)))

    def _labelled_rules(self, methods: Sequence[str | ContrastRule] | Mapping[str, str | ContrastRule]) -> dict[str, ContrastRule]:
        if isinstance(methods, Mapping):
            labelled = {str(label): self.resolve_method(m) for label, m in methods.items()}
        else:
            rules = [self.resolve_method(m) for m in methods]
            labels = [r.name for r in rules]
            if len(set(labels)) != len(labels):
                raise ValueError(f"methods {labels} repeat a name; pass a mapping label -> method to tell them apart")
            labelled = dict(zip(labels, rules))
        if not labelled:
            raise ValueError("methods must name at least one method")
        return labelled

    def generate_prepared(
        self,
        examples: Sequence[PreparedExample],
        **options: Unpack[MethodOptions],
    ) -> list[GenerationResult]:
        """Decode examples from `prepare` / `prepare_from_prompts` as they are (no templating, no trimming)."""
        rule, settings = self._method_and_settings(options)
        return self._decode_examples(list(examples), [rule], settings)[0]

    def generate_from_prompts(
        self,
        context_prompt: str,
        no_context_prompt: str,
        **options: Unpack[RawPromptOptions],
    ) -> GenerationResult:
        """Decode from two raw prompt strings (no templating); stops only on EOS, `stop` and the token budget."""
        example, rule, settings = self._raw_request(context_prompt, no_context_prompt, options)
        return self._decode_examples([example], [rule], settings)[0][0]

    def stream(
        self,
        question: str,
        documents: Sequence[Any] | None = None,
        **options: Unpack[MethodOptions],
    ) -> TextStream:
        """Text deltas as they are decoded; their concatenation equals the final `result.text`."""
        rule, settings = self._method_and_settings(options)
        example = self.prepare(question, documents, settings.max_new_tokens, document_paths=DOCUMENTS in rule.paths)
        return self._stream_example(example, rule, settings)

    def stream_from_prompts(
        self,
        context_prompt: str,
        no_context_prompt: str,
        **options: Unpack[RawPromptOptions],
    ) -> TextStream:
        """`stream` for two raw prompt strings."""
        example, rule, settings = self._raw_request(context_prompt, no_context_prompt, options)
        return self._stream_example(example, rule, settings)

    async def agenerate(self, question: str, documents: Sequence[Any] | None = None, **kwargs: Any) -> GenerationResult:
        """`generate` without blocking the event loop (decodes on a worker thread). For many concurrent
        callers, `fides_rag.batching.RequestBatcher` decodes them in shared batches instead."""
        return await asyncio.to_thread(self.generate, question, documents, **kwargs)

    async def agenerate_from_prompts(self, context_prompt: str, no_context_prompt: str, **kwargs: Any) -> GenerationResult:
        """`generate_from_prompts` without blocking the event loop."""
        return await asyncio.to_thread(self.generate_from_prompts, context_prompt, no_context_prompt, **kwargs)

    def astream(self, question: str, documents: Sequence[Any] | None = None, **kwargs: Any) -> AsyncTextStream:
        """`stream` as an async iterator (decoding runs on a worker thread; the event loop stays free)."""
        return AsyncTextStream(self.stream(question, documents, **kwargs))

    def astream_from_prompts(self, context_prompt: str, no_context_prompt: str, **kwargs: Any) -> AsyncTextStream:
        """`stream_from_prompts` as an async iterator."""
        return AsyncTextStream(self.stream_from_prompts(context_prompt, no_context_prompt, **kwargs))

    # -- requests ---------------------------------------------------------------------------------

    def _method_and_settings(self, options: MethodOptions) -> tuple[ContrastRule, GenerationSettings]:
        """The rule and the validated settings of a one-method call's options."""
        rest = dict(options)
        rule = self.resolve_method(rest.pop("method", None))
        return rule, GenerationSettings.build(self.max_new_tokens, rest)

    def _raw_request(
        self, context_prompt: str, no_context_prompt: str, options: RawPromptOptions
    ) -> tuple[PreparedExample, ContrastRule, GenerationSettings]:
        """The rule, settings and tokenised example of a raw-prompt call (shared by generate_ and stream_from_prompts)."""
        rest = dict(options)
        add_special_tokens = rest.pop("add_special_tokens", True)
        rule, settings = self._method_and_settings(rest)  # type: ignore[arg-type]
        refuse_document_paths(rule)
        example = self.prepare_from_prompts(context_prompt, no_context_prompt, settings.max_new_tokens, add_special_tokens)
        return example, rule, settings

    def setup_rules(self, rules: Sequence[ContrastRule]) -> list[Heads | None]:
        """Run each rule's setup hook once per decode call, before any decoding: its masked attention heads
        (DeCoRe's head discovery), checked against the model. None where a rule masks no heads."""
        lanes: list[Heads | None] = []
        for rule in rules:
            asked = rule.masked_heads(self.model, self.tokenizer) if MASKED_HEADS in rule.paths else None
            heads = self.anatomy.check_heads(asked, f"method {rule.name!r}") if asked is not None else {}
            if heads:
                self.anatomy.attention_output_projections()  # refuses a model whose heads cannot be masked
            lanes.append(heads or None)
        return lanes

    def _decode_examples(
        self, examples: list[PreparedExample], rules: list[ContrastRule], settings: GenerationSettings
    ) -> list[list[GenerationResult]]:
        """Decode every example under every rule; results[lane][example]. Examples without documents are
        decoded once with 'standard' on the question alone and reported under every lane."""
        with_docs = [i for i, e in enumerate(examples) if e.has_documents]
        without = [i for i, e in enumerate(examples) if not e.has_documents]
        results: list[list[GenerationResult | None]] = [[None] * len(examples) for _ in rules]
        check_document_paths(examples, rules)  # before any decoding, so bad input wastes no work
        if with_docs:
            units = self._run_to_end([examples[i] for i in with_docs], rules, settings, self.setup_rules(rules))
            for lane, rule in enumerate(rules):
                for i, unit in zip(with_docs, units[lane]):
                    results[lane][i] = assemble(examples[i], unit, rule, rule, unit.stop, self.decode_text)
        if without:
            standard = get_method("standard")
            units = self._run_to_end([examples[i] for i in without], [standard], settings, [None])
            for lane, rule in enumerate(rules):
                for i, unit in zip(without, units[0]):
                    results[lane][i] = assemble(examples[i], unit, standard, rule, unit.stop, self.decode_text)
        return [[r for r in lane if r is not None] for lane in results]

    def _run_to_end(
        self, examples: list[PreparedExample], rules: list[ContrastRule], settings: GenerationSettings, heads: list[Heads | None]
    ) -> list[list[Unit]]:
        units: list[list[Unit]] = []
        for units in self._decode_steps(examples, rules, settings, heads):
            pass
        return units

    def _stream_example(self, example: PreparedExample, rule: ContrastRule, settings: GenerationSettings) -> TextStream:
        effective = rule if example.has_documents else get_method("standard")  # as generate does
        check_document_paths([example], [effective])  # now, not at the first delta
        run = DecodeRun(self, [example], effective, rule, settings)
        tracker = DeltaTracker(example.stop + settings.stop)

        def deltas() -> Iterator[str]:
            for _ in run:
                delta = tracker.update(run.text(0))
                if delta:
                    yield delta
            stream.result = run.result(0)
            final = tracker.finish(stream.result.text)
            if final:
                yield final

        stream = TextStream(deltas())
        return stream

    def decode_text(self, token_ids: list[int]) -> str:
        """Generated ids as text (special tokens dropped, spacing kept as generated)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # -- the decode loop --------------------------------------------------------------------------

    def _decode_steps(
        self, examples: list[PreparedExample], rules: list[ContrastRule], settings: GenerationSettings,
        heads: list[Heads | None], rows: Sequence[RowSettings] | None = None,
    ) -> Iterator[list[list[Unit]]]:
        """Run the decoding loop (`generation/loop.py`); yield every unit's state (units[lane][example]) after every step."""
        with self._lock, torch.inference_mode():
            check_document_paths(examples, rules, skip_without_documents=False)
            rows = rows or [RowSettings(settings.max_new_tokens, settings.stop, settings.seed)] * len(examples)
            yield from decode_loop(self, examples, rules, settings, heads, rows)
