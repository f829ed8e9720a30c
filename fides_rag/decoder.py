"""The dual-path decoder: every path of every example in one forward call per step, with KV caches.

Rows of the batch come in groups, each only when some rule needs it: the context prompts [ctx_1 .. ctx_B],
the no-context prompts [noctx_1 .. noctx_B] (two-path rules), one prompt per document [d_1,1 .. d_B,N_B]
(rules with `needs_document_paths`), and a copy of the context rows per set of masked attention heads
(rules whose `masked_heads` names some). Rows are left-padded, with position ids counted over real tokens
only. Each step runs the backbone once, then one output-head matmul over the final states of all rows plus
any logit-lens rows, so the head's weights are read once per step.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from fides_rag.config import FidesConfig
from fides_rag.lens import ModelAnatomy
from fides_rag.prompts import PromptTemplate, document_texts, fit_texts
from fides_rag.result import FinishReason, GenerationResult, StepRecord
from fides_rag.rules import ContrastRule, StepInputs, get_method
from fides_rag.rules.fides import FidesRule

logger = logging.getLogger(__name__)

_MAX_SANE_CONTEXT = 10_000_000


class NonFiniteLogitsError(ValueError):
    """The model produced NaN or inf logits; decoding cannot continue meaningfully."""


@dataclass(frozen=True)
class GenerationSettings:
    """Per-call generation controls (validated)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    """EOS is suppressed until this many tokens exist (transformers' semantics; used to force full length)."""
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logits_processor: LogitsProcessorList | None = None
    stopping_criteria: StoppingCriteriaList | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.min_new_tokens, int) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be an integer in [0, max_new_tokens], got {self.min_new_tokens!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (use do_sample=False for greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if not self.do_sample and (self.temperature != 1.0 or self.top_p != 1.0 or self.top_k != 0):
            warnings.warn("temperature/top_p/top_k have no effect with greedy decoding; pass do_sample=True to sample", stacklevel=4)

    def warpers(self, prompt_width: int, eos_token_ids: set[int]) -> LogitsProcessorList:
        processors = LogitsProcessorList()
        if self.min_new_tokens > 0 and eos_token_ids:
            processors.append(MinNewTokensLengthLogitsProcessor(prompt_width, self.min_new_tokens, sorted(eos_token_ids)))
        processors.extend(self.logits_processor or [])
        if self.do_sample:
            if self.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k > 0:
                processors.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
        return processors


@dataclass
class PreparedExample:
    """The tokenised prompts of one example, and how they came to be."""

    context_prompt: str
    no_context_prompt: str
    context_ids: list[int]
    no_context_ids: list[int]
    stop: tuple[str, ...]
    has_documents: bool
    notes: list[str] = field(default_factory=list)
    documents_trimmed: bool = False
    document_tokens: tuple[int, int] | None = None
    document_prompts: list[str] | None = None
    """One prompt per document [d_n; x] (the context template with that document alone), for rules with
    `needs_document_paths`; None when they were not asked for (or cannot exist: raw prompts)."""
    document_ids: list[list[int]] | None = None


_PATHS = ("ctx", "no_ctx", "docs", "masked")
"""The row groups of a decode, in batch order (see the module docstring)."""


@dataclass
class _Unit:
    """Decoding state of one example under one method (a lane), and its rows in the current batch."""

    lane: int
    example: int
    stop: tuple[str, ...]
    rows: dict[str, list[int]]
    """Path ("ctx", "no_ctx", "docs", "masked") -> this unit's batch rows of it; only the paths its rule runs.
    One row per path, except "docs": one per document."""
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def ctx_row(self) -> int:
        return self.rows["ctx"][0]

    @property
    def no_ctx_row(self) -> int:
        """-1 for single-path rules."""
        rows = self.rows.get("no_ctx")
        return rows[0] if rows else -1


@dataclass
class _RowGroup:
    """Prompts encoded together at prefill: one path of every example (or every document of every example)."""

    ids: torch.Tensor
    """[n, T] left-padded input ids."""
    mask: torch.Tensor
    """[n, T] attention mask."""
    head_set: int = -1
    """Index of the set of masked attention heads these rows run with; -1 for none."""


class _HeadMasker:
    """Zeroes chosen attention heads' outputs on chosen rows: a forward pre-hook on each affected block's
    attention output projection, whose input holds the heads' outputs side by side, [R, T, heads * head_dim]."""

    def __init__(self, anatomy: ModelAnatomy, head_sets: Sequence[Mapping[int, tuple[int, ...]]]) -> None:
        projections = anatomy.attention_output_projections()
        dim = anatomy.head_dim
        self._tables: dict[int, torch.Tensor] = {}
        """layer -> [1 + S, heads * head_dim] multipliers: row 0 keeps every head, row 1 + s zeroes set s's heads."""
        for layer in sorted(set().union(*head_sets)):
            weight = projections[layer - 1].weight
            width = projections[layer - 1].in_features
            table = torch.ones(1 + len(head_sets), width, dtype=weight.dtype, device=weight.device)
            for s, heads in enumerate(head_sets, 1):
                for h in heads.get(layer, ()):
                    table[s, h * dim : (h + 1) * dim] = 0
            self._tables[layer] = table
        self._keep: dict[int, torch.Tensor] = {}
        self._handles = [projections[layer - 1].register_forward_pre_hook(self._hook(layer)) for layer in self._tables]

    def set_rows(self, row_sets: Sequence[int]) -> None:
        """The head set (index, or -1 for none) of every row of the forwards that follow."""
        if all(s < 0 for s in row_sets):
            self._keep = {}
            return
        index = [s + 1 for s in row_sets]
        self._keep = {
            layer: table[torch.tensor(index, dtype=torch.long, device=table.device)]  # [R, heads * head_dim]
            for layer, table in self._tables.items()
        }

    def _hook(self, layer: int):
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            keep = self._keep.get(layer)
            if keep is None:
                return None
            heads_out = args[0]  # [R, T, heads * head_dim]
            if heads_out.shape[0] != keep.shape[0]:
                raise RuntimeError(f"head mask for {keep.shape[0]} rows applied to a forward of {heads_out.shape[0]} rows")
            return (heads_out * keep[:, None, :].to(heads_out.device, heads_out.dtype), *args[1:])

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._keep = {}


def _as_float(value: torch.Tensor | None, row: int) -> float | None:
    return None if value is None else float(value[row])


def first_stop_index(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _held_back_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-length:]):
                longest = max(longest, length)
                break
    return longest


def _left_padded(sequences: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [N, T] for left-padded sequences."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long, device=device)
        mask[i, width - len(seq) :] = 1
    return ids, mask


def _pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _mergeable(cache: Any) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def _merge_caches(caches: Sequence[Any]) -> Any:
    """Stack left-padded KV caches along the batch, left-padding the shorter ones' stored keys (into the first).

    Sliding-window layers store only their last window-1 positions and count every position seen; the merged
    layer counts the longest history, and the padded slots fall on positions the attention mask hides.
    """
    first = caches[0]
    for index, merged in enumerate(first.layers):
        parts = [cache.layers[index] for cache in caches]
        length = max(part.keys.shape[-2] for part in parts)
        merged.keys = torch.cat([_pad_left(part.keys, length, -2) for part in parts], dim=0)
        merged.values = torch.cat([_pad_left(part.values, length, -2) for part in parts], dim=0)
        if isinstance(merged, DynamicSlidingWindowLayer):
            merged.cumulative_length = max(part.cumulative_length for part in parts)
    return first



class TextStream(Iterator[str]):
    """Text deltas of one generation; after exhaustion `result` holds the full GenerationResult."""

    def __init__(self, deltas: Iterator[str]) -> None:
        self._deltas = deltas
        self.result: GenerationResult | None = None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()


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
        config: FidesConfig | None = None,
        *,
        prompt_template: PromptTemplate | None = None,
        use_chat_template: bool | None = None,
        max_new_tokens: int = 128,
        split_prefill: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.anatomy = ModelAnatomy.of(model)
        self.config = config if config is not None else FidesConfig()
        if not isinstance(self.config, FidesConfig):
            raise TypeError(f"config must be a FidesConfig, got {type(self.config).__name__}")
        self.method = self.resolve_method(method)
        self.prompt_template = prompt_template or PromptTemplate()
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.use_chat_template = has_template if use_chat_template is None else use_chat_template
        GenerationSettings(max_new_tokens=max_new_tokens)
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = self._collect_eos_ids()
        self.context_window = self._context_window()
        self.split_prefill = split_prefill
        """Encode each path's prompt in its own forward (exact; saves the no-context path's padding)."""
        self._lock = threading.RLock()

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str = "auto", dtype: Any = None, **kwargs: Any) -> FidesDecoder:
        """Load a model with `load_model` and wrap it."""
        from fides_rag.loading import load_model

        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    # -- setup ----------------------------------------------------------------------------------

    def resolve_method(self, method: str | ContrastRule | None) -> ContrastRule:
        """A rule object for `method`; the name "fides" uses this decoder's FidesConfig."""
        if method is None:
            return self.method
        if method == "fides":
            return FidesRule(self.config)
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

    def _context_window(self) -> int:
        candidates = [
            getattr(self.model.config, "max_position_embeddings", None),
            getattr(self.tokenizer, "model_max_length", None),
        ]
        sane = [int(c) for c in candidates if isinstance(c, int) and 0 < c < _MAX_SANE_CONTEXT]
        return min(sane) if sane else _MAX_SANE_CONTEXT

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- prompts --------------------------------------------------------------------------------

    def _encode(self, text: str, templated: bool) -> list[int]:
        # A chat template already wrote any BOS token into the text.
        return self.tokenizer(text, add_special_tokens=not templated)["input_ids"]

    def _render(self, question: str, document_block: str | None) -> tuple[str, list[int]]:
        text = self.prompt_template.render(self.tokenizer, question, document_block, self.use_chat_template)
        return text, self._encode(text, templated=self.use_chat_template)

    def _render_fitted(
        self, question: str, texts: Sequence[str], max_new_tokens: int
    ) -> tuple[str, list[int], tuple[int, int] | None]:
        """The context-template prompt over `texts`, its ids, and (block tokens given, kept) when the document
        block had to be cut at its end so that the prompt plus max_new_tokens fits the context window."""
        fitted = fit_texts(
            {"documents": self.prompt_template.document_block(texts)},
            lambda kept: self._render(question, kept["documents"]),
            lambda rendered: len(rendered[1]),
            self.context_window - max_new_tokens,
            self.tokenizer,
        )
        prompt, ids = fitted.rendered
        return prompt, ids, (fitted.tokens_before, fitted.tokens_after) if fitted.trimmed else None

    def _note(self, example: PreparedExample, what: str, max_new_tokens: int) -> None:
        note = f"{what} so that the prompt plus max_new_tokens={max_new_tokens} fits the context window of {self.context_window}"
        logger.warning(note)
        example.notes.append(note)

    def prepare(self, question: str, documents: Any, max_new_tokens: int, *, document_paths: bool = False) -> PreparedExample:
        """Render and tokenise both branches of one example, trimming documents that would not fit.

        With `document_paths`, also one prompt per document (for rules with `needs_document_paths`), each
        trimmed on its own in the same way."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        question = question.strip()
        texts = document_texts(documents)
        budget = self.context_window - max_new_tokens
        no_ctx_prompt, no_ctx_ids = self._render(question, None)
        if len(no_ctx_ids) > budget:
            raise ValueError(
                f"the question alone takes {len(no_ctx_ids)} prompt tokens, more than the context window "
                f"({self.context_window}) minus max_new_tokens ({max_new_tokens}); shorten it or lower max_new_tokens"
            )
        stop = () if self.use_chat_template else tuple(self.prompt_template.stop)
        if not texts:
            note = "no documents were given: decoded with 'standard' on the question alone"
            logger.warning(note)
            return PreparedExample(no_ctx_prompt, no_ctx_prompt, no_ctx_ids, no_ctx_ids, stop, False, [note])

        ctx_prompt, ctx_ids, trimmed = self._render_fitted(question, texts, max_new_tokens)
        example = PreparedExample(ctx_prompt, no_ctx_prompt, ctx_ids, no_ctx_ids, stop, True)
        if trimmed is not None:
            self._note(example, f"documents trimmed from {trimmed[0]} to {trimmed[1]} tokens", max_new_tokens)
            example.documents_trimmed = True
            example.document_tokens = trimmed
        if document_paths:
            example.document_prompts, example.document_ids = [], []
            for number, text in enumerate(texts, 1):
                prompt, ids, cut = self._render_fitted(question, [text], max_new_tokens)
                example.document_prompts.append(prompt)
                example.document_ids.append(ids)
                if cut is not None:
                    self._note(example, f"document {number}'s own prompt trimmed from {cut[0]} to {cut[1]} tokens", max_new_tokens)
        return example

    def prepare_from_prompts(
        self, context_prompt: str, no_context_prompt: str, max_new_tokens: int, add_special_tokens: bool = True
    ) -> PreparedExample:
        """Tokenise two raw prompts as the tokenizer does by default (no template, no trimming).

        Pass add_special_tokens=False for text that already holds them, e.g. from `apply_chat_template`."""
        for name, prompt in (("context_prompt", context_prompt), ("no_context_prompt", no_context_prompt)):
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{name} must be a non-empty string, got {prompt!r}")
        ctx_ids = self.tokenizer(context_prompt, add_special_tokens=add_special_tokens)["input_ids"]
        no_ctx_ids = self.tokenizer(no_context_prompt, add_special_tokens=add_special_tokens)["input_ids"]
        longest = max(len(ctx_ids), len(no_ctx_ids))
        if longest + max_new_tokens > self.context_window:
            raise ValueError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the context window "
                f"of {self.context_window}; shorten the prompt or lower max_new_tokens"
            )
        return PreparedExample(context_prompt, no_context_prompt, ctx_ids, no_ctx_ids, (), True)

    # -- public API -------------------------------------------------------------------------------

    def _settings(self, max_new_tokens: int | None, stop: Sequence[str] | str | None, **kwargs: Any) -> GenerationSettings:
        if isinstance(stop, str):
            stop = [stop]
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            stop=tuple(stop or ()),
            **kwargs,
        )

    def generate(
        self,
        question: str,
        documents: Sequence[Any] | None = None,
        *,
        method: str | ContrastRule | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        **generation_kwargs: Any,
    ) -> GenerationResult:
        """Answer `question` from `documents` with `method` (default: the decoder's).

        generation_kwargs: do_sample, temperature, top_p, top_k, seed, logits_processor, stopping_criteria.
        """
        return self.generate_batch([question], [documents], method=method, max_new_tokens=max_new_tokens, stop=stop, **generation_kwargs)[0]

    def generate_batch(
        self,
        questions: Sequence[str],
        documents_per_question: Sequence[Sequence[Any] | None] | None = None,
        *,
        method: str | ContrastRule | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        **generation_kwargs: Any,
    ) -> list[GenerationResult]:
        """Answer several questions in one batched decode (all paths of all examples in one forward per step)."""
        if isinstance(questions, str):
            raise TypeError("generate_batch takes a list of questions; use generate for a single question")
        if documents_per_question is None:
            documents_per_question = [None] * len(questions)
        if len(documents_per_question) != len(questions):
            raise ValueError(
                f"got {len(questions)} questions but {len(documents_per_question)} document lists; pass one list per question"
            )
        rule = self.resolve_method(method)
        settings = self._settings(max_new_tokens, stop, **generation_kwargs)
        examples = [
            self.prepare(q, d, settings.max_new_tokens, document_paths=rule.needs_document_paths)
            for q, d in zip(questions, documents_per_question)
        ]
        return self._decode_examples(examples, [rule], settings)[0]

    def generate_methods(
        self,
        questions: Sequence[str],
        documents_per_question: Sequence[Sequence[Any] | None] | None,
        methods: Sequence[str | ContrastRule] | Mapping[str, str | ContrastRule],
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        **generation_kwargs: Any,
    ) -> dict[str, list[GenerationResult]]:
        """Answer every question under every method in one decode that shares the prompts' prefill.

        `methods` is a list of names/rules, or a mapping label -> name/rule (needed when two configured
        rules share a name, e.g. FIDES ablations). Returns label -> one result per question, each identical
        to what `generate_batch` gives for that method alone.
        """
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
        if isinstance(questions, str):
            raise TypeError("generate_methods takes a list of questions")
        if documents_per_question is None:
            documents_per_question = [None] * len(questions)
        if len(documents_per_question) != len(questions):
            raise ValueError(
                f"got {len(questions)} questions but {len(documents_per_question)} document lists; pass one list per question"
            )
        settings = self._settings(max_new_tokens, stop, **generation_kwargs)
        document_paths = any(rule.needs_document_paths for rule in labelled.values())
        examples = [
            self.prepare(q, d, settings.max_new_tokens, document_paths=document_paths)
            for q, d in zip(questions, documents_per_question)
        ]
        per_lane = self._decode_examples(examples, list(labelled.values()), settings)
        return dict(zip(labelled, per_lane))

    def generate_from_prompts(
        self,
        context_prompt: str,
        no_context_prompt: str,
        *,
        method: str | ContrastRule | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        add_special_tokens: bool = True,
        **generation_kwargs: Any,
    ) -> GenerationResult:
        """Decode from two raw prompt strings (no templating); stops only on EOS, `stop` and the token budget."""
        example, rule, settings = self._raw_request(context_prompt, no_context_prompt, method, max_new_tokens, stop, add_special_tokens, generation_kwargs)
        return self._decode_examples([example], [rule], settings)[0][0]

    def stream(
        self,
        question: str,
        documents: Sequence[Any] | None = None,
        *,
        method: str | ContrastRule | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        **generation_kwargs: Any,
    ) -> TextStream:
        """Text deltas as they are decoded; their concatenation equals the final `result.text`."""
        rule = self.resolve_method(method)
        settings = self._settings(max_new_tokens, stop, **generation_kwargs)
        example = self.prepare(question, documents, settings.max_new_tokens, document_paths=rule.needs_document_paths)
        return self._stream_example(example, rule, settings)

    def stream_from_prompts(
        self,
        context_prompt: str,
        no_context_prompt: str,
        *,
        method: str | ContrastRule | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | str | None = None,
        add_special_tokens: bool = True,
        **generation_kwargs: Any,
    ) -> TextStream:
        """`stream` for two raw prompt strings."""
        example, rule, settings = self._raw_request(context_prompt, no_context_prompt, method, max_new_tokens, stop, add_special_tokens, generation_kwargs)
        return self._stream_example(example, rule, settings)

    # -- decoding ---------------------------------------------------------------------------------

    def _raw_request(
        self, context_prompt: str, no_context_prompt: str, method: str | ContrastRule | None,
        max_new_tokens: int | None, stop: Sequence[str] | str | None, add_special_tokens: bool, generation_kwargs: dict[str, Any],
    ) -> tuple[PreparedExample, ContrastRule, GenerationSettings]:
        """The rule, settings and tokenised example of a raw-prompt call (shared by generate_ and stream_from_prompts)."""
        rule = self.resolve_method(method)
        self._refuse_document_paths(rule)
        settings = self._settings(max_new_tokens, stop, **generation_kwargs)
        example = self.prepare_from_prompts(context_prompt, no_context_prompt, settings.max_new_tokens, add_special_tokens)
        return example, rule, settings

    @staticmethod
    def _refuse_document_paths(rule: ContrastRule) -> None:
        if rule.needs_document_paths:
            raise ValueError(
                f"method {rule.name!r} runs one path per document, which raw prompts cannot provide; pass the "
                f"question and its documents to generate / generate_batch / generate_methods / stream instead"
            )

    @staticmethod
    def _check_document_paths(
        examples: Sequence[PreparedExample], rules: Sequence[ContrastRule], skip_without_documents: bool = True
    ) -> None:
        """Every example a rule with per-document paths decodes has >= 2 prepared document prompts
        (`skip_without_documents`: examples without documents, which go to 'standard', are not checked)."""
        for rule in rules:
            if not rule.needs_document_paths:
                continue
            for i, example in enumerate(examples):
                if skip_without_documents and not example.has_documents:
                    continue  # decoded with 'standard' on the question alone, like under every method
                if example.document_ids is None:
                    raise ValueError(
                        f"method {rule.name!r} runs one path per document, but example {i} has no per-document "
                        f"prompts: raw prompts cannot provide them, and `prepare` makes them only with "
                        f"document_paths=True; pass the question and its documents to generate / generate_batch / "
                        f"generate_methods / stream"
                    )
                if len(example.document_ids) < 2:
                    raise ValueError(
                        f"method {rule.name!r} contrasts a question's documents with each other and needs at least "
                        f"2 documents per question, but example {i} has {len(example.document_ids)}; give it more "
                        f"documents or use a method without per-document paths (e.g. 'cad')"
                    )

    def _lane_heads(self, rules: Sequence[ContrastRule]) -> list[dict[int, tuple[int, ...]] | None]:
        """Each rule's masked attention heads (asked once per decode call), checked against the model."""
        lanes: list[dict[int, tuple[int, ...]] | None] = []
        for rule in rules:
            asked = rule.masked_heads(self.model, self.tokenizer)
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
        self._check_document_paths(examples, rules)  # before any decoding, so bad input wastes no work
        heads = self._lane_heads(rules) if with_docs else None
        if with_docs:
            units = self._run_to_end([examples[i] for i in with_docs], rules, settings, heads)
            for lane, rule in enumerate(rules):
                for i, unit in zip(with_docs, units[lane]):
                    results[lane][i] = self._result(examples[i], unit, rule, rule, settings)
        if without:
            standard = get_method("standard")
            units = self._run_to_end([examples[i] for i in without], [standard], settings)
            for lane, rule in enumerate(rules):
                for i, unit in zip(without, units[0]):
                    results[lane][i] = self._result(examples[i], unit, standard, rule, settings)
        return [[r for r in lane if r is not None] for lane in results]

    def _run_to_end(
        self,
        examples: list[PreparedExample],
        rules: list[ContrastRule],
        settings: GenerationSettings,
        heads: list[dict[int, tuple[int, ...]] | None] | None = None,
    ) -> list[list[_Unit]]:
        units: list[list[_Unit]] = []
        for units in self._decode_steps(examples, rules, settings, heads):
            pass
        return units

    def _stream_example(self, example: PreparedExample, rule: ContrastRule, settings: GenerationSettings) -> TextStream:
        extra_path = rule.needs_no_context or rule.needs_document_paths
        effective = rule if example.has_documents or not extra_path else get_method("standard")
        stops = example.stop + settings.stop
        self._check_document_paths([example], [effective])  # now, not at the first delta
        heads = self._lane_heads([effective])

        def deltas() -> Iterator[str]:
            emitted = ""
            unit: _Unit | None = None
            for units in self._decode_steps([example], [effective], settings, heads):
                unit = units[0][0]
                text = self._decode_text(unit.generated)
                cut = first_stop_index(text, stops)
                if cut is not None:
                    text = text[:cut]
                else:
                    text = text[: len(text) - _held_back_suffix(text, stops)]
                safe = text.lstrip().rstrip("\ufffd").rstrip()
                if len(safe) > len(emitted) and safe.startswith(emitted):
                    yield safe[len(emitted) :]
                    emitted = safe
            assert unit is not None
            stream.result = self._result(example, unit, effective, rule, settings)
            final = stream.result.text
            if final.startswith(emitted):
                if len(final) > len(emitted):
                    yield final[len(emitted) :]
            else:  # only if the tokenizer's decoding of a prefix is not a prefix of the full decoding
                logger.warning("streamed text %r is not a prefix of the final text %r", emitted, final)

        stream = TextStream(deltas())
        return stream

    def _decode_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _result(
        self, example: PreparedExample, unit: _Unit, effective: ContrastRule, requested: ContrastRule, settings: GenerationSettings
    ) -> GenerationResult:
        text = self._decode_text(unit.generated)
        cut = first_stop_index(text, example.stop + settings.stop)
        if cut is not None:
            text = text[:cut]
        two_path = effective.needs_no_context
        return GenerationResult(
            text=text.strip(),
            token_ids=list(unit.generated),
            steps=list(unit.steps),
            method=effective.name,
            requested_method=requested.name,
            method_options=effective.options(),
            finish_reason=unit.finish_reason or "length",
            context_prompt=example.context_prompt,
            no_context_prompt=example.no_context_prompt if two_path else None,
            prompt_tokens=len(example.context_ids),
            notes=list(example.notes),
            documents_trimmed=example.documents_trimmed,
            document_tokens=example.document_tokens,
        )

    def _decode_steps(
        self,
        examples: list[PreparedExample],
        rules: list[ContrastRule],
        settings: GenerationSettings,
        heads: list[dict[int, tuple[int, ...]] | None] | None = None,
    ) -> Iterator[list[list[_Unit]]]:
        """Run the decoding loop; yield every unit's state (units[lane][example]) after every step.

        `heads`: each lane's masked heads from `_lane_heads` (asked here when not given)."""
        with self._lock, torch.inference_mode():
            self._check_document_paths(examples, rules, skip_without_documents=False)
            if heads is None:
                heads = self._lane_heads(rules)
            yield from self._decode_loop(examples, rules, settings, heads)

    def _decode_loop(
        self,
        examples: list[PreparedExample],
        rules: list[ContrastRule],
        settings: GenerationSettings,
        heads: list[dict[int, tuple[int, ...]] | None],
    ) -> Iterator[list[list[_Unit]]]:
        anatomy, device = self.anatomy, self.device
        num_layers = anatomy.num_layers
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        # Prefill row groups, shared by every lane (method); see the module docstring for the order.
        groups: list[_RowGroup] = []

        def add_group(sequences: list[list[int]], head_set: int = -1) -> int:
            start = sum(g.ids.shape[0] for g in groups)
            groups.append(_RowGroup(*_left_padded(sequences, pad_id, device), head_set=head_set))
            return start

        add_group([e.context_ids for e in examples])  # rows 0 .. B-1
        no_ctx_start = add_group([e.no_context_ids for e in examples]) if any(r.needs_no_context for r in rules) else -1
        doc_first: list[int] = []  # example b's first document row, relative to the group
        docs_start = -1
        if any(r.needs_document_paths for r in rules):
            flat: list[list[int]] = []
            for e in examples:
                doc_first.append(len(flat))
                flat.extend(e.document_ids or [])
            docs_start = add_group(flat)
        head_keys = [tuple(h.items()) if h else None for h in heads]
        distinct = list(dict.fromkeys(k for k in head_keys if k is not None))  # lanes with equal heads share rows
        lane_set = [distinct.index(k) if k is not None else -1 for k in head_keys]
        masked_starts = [add_group([e.context_ids for e in examples], head_set=s) for s in range(len(distinct))]
        row_sets = [g.head_set for g in groups for _ in range(g.ids.shape[0])]  # head set of every row
        width = max(g.ids.shape[1] for g in groups)
        prompt_ids = groups[0].ids  # [B, Tc], what logits processors see before the generated tokens
        prompt_width = prompt_ids.shape[1]

        def first_rows(rule: ContrastRule, lane: int, b: int) -> dict[str, list[int]]:
            rows = {"ctx": [b]}
            if rule.needs_no_context:
                rows["no_ctx"] = [no_ctx_start + b]
            if rule.needs_document_paths:
                first = docs_start + doc_first[b]
                rows["docs"] = list(range(first, first + len(examples[b].document_ids or [])))
            if lane_set[lane] >= 0:
                rows["masked"] = [masked_starts[lane_set[lane]] + b]
            return rows

        units = [
            [
                _Unit(
                    lane=lane,
                    example=b,
                    stop=e.stop + settings.stop,
                    rows=first_rows(rule, lane, b),
                    generator=torch.Generator(device=device).manual_seed(settings.seed)
                    if settings.do_sample and settings.seed is not None
                    else None,
                )
                for b, e in enumerate(examples)
            ]
            for lane, rule in enumerate(rules)
        ]
        lens_by_lane = [rule.lens_layers(num_layers) for rule in rules]
        states_by_lane = [rule.needs_no_context and rule.needs_layer_states for rule in rules]
        hooked = set().union(*map(set, lens_by_lane)) | (set(range(1, num_layers + 1)) if any(states_by_lane) else set())
        captured: dict[int, torch.Tensor] = {}

        def capture(layer: int):
            def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
                hidden = output[0] if isinstance(output, tuple) else output
                captured[layer] = hidden[:, -1, :]  # [R, H]

            return hook

        handles = [anatomy.layers[l - 1].register_forward_hook(capture(l)) for l in sorted(hooked)]
        masker = _HeadMasker(anatomy, [dict(k) for k in distinct]) if distinct else None
        processors = settings.warpers(prompt_width, self.eos_token_ids)
        try:
            for step in range(settings.max_new_tokens):
                if step == 0:
                    last_hidden, cache, attention_mask, position_ids = self._prefill(groups, width, captured, masker)
                    if masker is not None:
                        masker.set_rows(row_sets)
                else:
                    out = anatomy.backbone(
                        input_ids=step_ids, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True,
                    )
                    cache, last_hidden = out.past_key_values, out.last_hidden_state[:, -1, :]  # [R, H]
                num_rows = last_hidden.shape[0]
                active = [[u for u in lane if u.finish_reason is None] for lane in units]

                # One head matmul: final states of all rows, then logit-lens rows (each (layer, row) once).
                lens_rows: dict[int, list[int]] = {}
                for lane, lane_units in enumerate(active):
                    for layer in lens_by_lane[lane]:
                        lens_rows.setdefault(layer, [])
                        lens_rows[layer] += [u.ctx_row for u in lane_units if u.ctx_row not in lens_rows[layer]]
                head_inputs = [last_hidden]  # [R, H], already final-normed
                lens_position: dict[tuple[int, int], int] = {}
                offset = num_rows
                for layer, rows in lens_rows.items():
                    head_inputs.append(anatomy.final_norm(captured[layer][rows]))  # [n, H]
                    lens_position.update({(layer, row): offset + k for k, row in enumerate(rows)})
                    offset += len(rows)
                logits = anatomy.head_logits(torch.cat(head_inputs, dim=0)).float()  # [R + n_lens, V]
                if not torch.isfinite(logits).all():
                    raise NonFiniteLogitsError(
                        f"the model produced NaN or inf logits at generation step {step}; this usually means the "
                        f"weights or dtype ({self.model.dtype}) overflow: load the model in float32 or bfloat16"
                    )
                layer_states = None
                if any(states_by_lane):
                    layer_states = torch.stack([captured[l] for l in range(1, num_layers + 1)]).float()  # [L, R, H]

                for lane, rule in enumerate(rules):
                    lane_units = active[lane]
                    if lane_units:
                        self._advance_lane(
                            rule, lane_units, logits, layer_states, lens_by_lane[lane], lens_position,
                            prompt_ids, processors, settings, step,
                        )
                yield units

                # Next rows: the chosen token on every path of every unfinished unit; finished rows leave the cache.
                # Per lane, path by path (a single lane with nobody finished keeps its rows in place).
                previous_rows: list[int] = []
                next_tokens: list[int] = []
                for lane_units in units:
                    running = [u for u in lane_units if u.finish_reason is None]
                    for path in _PATHS:
                        for unit in running:
                            rows = unit.rows.get(path)
                            if rows is None:
                                continue
                            unit.rows[path] = list(range(len(previous_rows), len(previous_rows) + len(rows)))
                            previous_rows += rows
                            next_tokens += [unit.generated[-1]] * len(rows)
                if not previous_rows:
                    break
                if previous_rows != list(range(num_rows)):
                    keep = torch.tensor(previous_rows, dtype=torch.long, device=device)
                    cache.batch_select_indices(keep)
                    attention_mask, position_ids = attention_mask[keep], position_ids[keep]
                    if masker is not None:
                        row_sets = [row_sets[r] for r in previous_rows]
                        masker.set_rows(row_sets)
                step_ids = torch.tensor(next_tokens, dtype=torch.long, device=device)[:, None]  # [R', 1]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(previous_rows), 1))], dim=-1)
                position_ids = position_ids[:, -1:] + 1
        finally:
            for handle in handles:
                handle.remove()
            if masker is not None:
                masker.remove()

    def _joint_prefill(
        self, groups: list[_RowGroup], width: int, masker: _HeadMasker | None
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        ids = torch.cat([_pad_left(g.ids, width, 1) for g in groups])
        mask = torch.cat([_pad_left(g.mask, width, 1) for g in groups])
        positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [R, T], real tokens count from 0
        if masker is not None:
            masker.set_rows([g.head_set for g in groups for _ in range(g.ids.shape[0])])
        out = self.anatomy.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        return out.last_hidden_state[:, -1, :], out.past_key_values, mask, positions[:, -1:]

    def _prefill(
        self, groups: list[_RowGroup], width: int, captured: dict[int, torch.Tensor], masker: _HeadMasker | None
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Encode the prompts of all paths; return last hidden states, the KV cache, the attention mask and
        the last position of every row.

        With `split_prefill`, each group of rows is encoded in its own forward (padded only to its own longest
        prompt, so the short no-context prompt costs its own length, not the documents'; masked heads apply to
        their own group's forward only) and the caches are merged; otherwise all rows go through one forward
        padded to the longest prompt. Both give the same states.
        """
        if not self.split_prefill or len(groups) == 1:
            return self._joint_prefill(groups, width, masker)
        outputs, captures = [], []
        for group in groups:
            if masker is not None:
                masker.set_rows([group.head_set] * group.ids.shape[0])
            positions = (group.mask.cumsum(-1) - 1).clamp_min(0)  # real tokens count from 0
            outputs.append(
                self.anatomy.backbone(input_ids=group.ids, attention_mask=group.mask, position_ids=positions, use_cache=True)
            )
            captures.append(dict(captured))
        caches = [o.past_key_values for o in outputs]
        if not all(_mergeable(c) for c in caches):  # a cache layout we cannot merge: encode again, jointly
            return self._joint_prefill(groups, width, masker)
        for layer in captured:
            captured[layer] = torch.cat([c[layer] for c in captures])
        mask = torch.cat([_pad_left(g.mask, width, 1) for g in groups])
        last_positions = torch.cat([g.mask.sum(-1, keepdim=True) - 1 for g in groups])
        last_hidden = torch.cat([o.last_hidden_state[:, -1, :] for o in outputs])
        return last_hidden, _merge_caches(caches), mask, last_positions

    def _advance_lane(
        self,
        rule: ContrastRule,
        lane_units: list[_Unit],
        logits: torch.Tensor,
        layer_states: torch.Tensor | None,
        lens_layers: tuple[int, ...],
        lens_position: dict[tuple[int, int], int],
        prompt_ids: torch.Tensor,
        processors: LogitsProcessorList,
        settings: GenerationSettings,
        step: int,
    ) -> None:
        """Combine one lane's paths, choose each unit's next token, record it and check stopping."""
        device = logits.device
        ctx_rows = torch.tensor([u.ctx_row for u in lane_units], device=device)
        inputs = StepInputs(ctx_logits=logits[ctx_rows], no_ctx_logits=None, num_layers=self.anatomy.num_layers)
        inputs.lens_logits = {
            layer: logits[torch.tensor([lens_position[(layer, u.ctx_row)] for u in lane_units], device=device)]
            for layer in lens_layers
        }
        if rule.needs_no_context:
            no_ctx_rows = torch.tensor([u.no_ctx_row for u in lane_units], device=device)
            inputs.no_ctx_logits = logits[no_ctx_rows]
            if rule.needs_layer_states and layer_states is not None:
                inputs.ctx_layer_states = layer_states[:, ctx_rows]
                inputs.no_ctx_layer_states = layer_states[:, no_ctx_rows]
        if rule.needs_document_paths:
            docs = [u.rows["docs"] for u in lane_units]
            most = max(len(d) for d in docs)
            index = torch.tensor([d + d[:1] * (most - len(d)) for d in docs], device=device)  # [n, N], pads repeat a row
            present = torch.tensor([[True] * len(d) + [False] * (most - len(d)) for d in docs], device=device)  # [n, N]
            inputs.document_logits = logits[index].masked_fill(~present[..., None], 0.0)  # [n, N, V]
            inputs.document_mask = present
        if "masked" in lane_units[0].rows:
            inputs.masked_logits = logits[torch.tensor([u.rows["masked"][0] for u in lane_units], device=device)]
        decided = rule.combine(inputs)
        scores = decided.logits  # [n, V]
        examples = torch.tensor([u.example for u in lane_units], device=device)
        generated = torch.tensor([u.generated for u in lane_units], dtype=torch.long, device=device).reshape(len(lane_units), -1)
        context_ids = torch.cat([prompt_ids[examples], generated], dim=-1)  # [n, T + t]
        if processors:
            scores = processors(context_ids, scores)
        if torch.isnan(scores).any():
            raise NonFiniteLogitsError(f"the contrast rule {rule.name!r} produced NaN scores at step {step}")
        if settings.do_sample:
            probs = torch.softmax(scores, dim=-1)
            chosen = [int(torch.multinomial(probs[i], 1, generator=u.generator)) for i, u in enumerate(lane_units)]
        else:
            chosen = scores.argmax(dim=-1).tolist()
        criteria_hit = None
        if settings.stopping_criteria:
            with_new = torch.cat([context_ids, torch.tensor(chosen, device=device)[:, None]], dim=-1)
            criteria_hit = settings.stopping_criteria(with_new, scores)
        for i, (unit, token_id) in enumerate(zip(lane_units, chosen)):
            unit.generated.append(token_id)
            unit.steps.append(
                StepRecord(
                    token_id=token_id,
                    token=self.tokenizer.decode([token_id]),
                    alpha=_as_float(decided.alpha, i),
                    opposition=_as_float(decided.opposition, i),
                    shift=_as_float(decided.shift, i),
                    noise=_as_float(decided.noise, i),
                    score=_as_float(decided.score, i),
                )
            )
            if token_id in self.eos_token_ids:
                unit.finish_reason = "eos"
            elif unit.stop and first_stop_index(self._decode_text(unit.generated), unit.stop) is not None:
                unit.finish_reason = "stop"
            elif criteria_hit is not None and bool(criteria_hit[i]):
                unit.finish_reason = "criteria"
            elif len(unit.generated) >= settings.max_new_tokens:
                unit.finish_reason = "length"
