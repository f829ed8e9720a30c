"""The decode engine: one object owns what decoding needs (the model's anatomy, the tokenizer and its EOS ids,
the input device, the model lock, the rules' head setup, text decoding) and decodes every request submitted
to it with continuous batching.

Its thread runs steps while anything is in flight: the scheduler (`scheduler.py`) plans each step (its newcomers,
decodes and prefill budget, `step_plan.py`) and the engine carries the plan out: the step runs one forward of
every decoding row, then prefill chunks of admitted requests within the budget (a request's rows join the running
cache once its prompts are prefilled), one head matmul, each lane's rule and choice, and one host transfer, then
releases the requests that finished as the scheduler says: their results, with every recorded value, go back.
A greedy request gives the same tokens whatever else is in flight.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fides_rag.errors import QueueFullError
from fides_rag.generation.detokenize import IncrementalText
from fides_rag.generation.engine.attention.registry import BACKENDS, resolve_attention
from fides_rag.generation.engine.block_manager import BlockManager
from fides_rag.generation.engine.captured_step import (
    DEFAULT_BUCKETS,
    CapturedStep,
    check_buckets,
    check_compile,
    fits_buckets,
)
from fides_rag.generation.engine.in_flight import InFlight
from fides_rag.generation.engine.kv_cache import DecodeCache, mergeable
from fides_rag.generation.engine.kv_pool_size import BLOCK, pool_blocks
from fides_rag.generation.engine.kv_store import KVStore
from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.engine.modes import Mode, check_mode_settings, resolve_mode
from fides_rag.generation.engine.pooled_store import PooledStore, PoolSettings
from fides_rag.generation.engine.prefix_cache import DEFAULT_PREFIX_BLOCK_SIZE, DEFAULT_PREFIX_CACHE_BYTES, PrefixCache
from fides_rag.generation.engine.ragged_attention import per_segment_attention
from fides_rag.generation.engine.ragged_store import RaggedStore
from fides_rag.generation.engine.runner import Runner
from fides_rag.generation.engine.scheduler import (
    DEFAULT_BATCHED_TOKENS,
    Admission,
    Scheduler,
    check_bounds,
)
from fides_rag.generation.engine.step_plan import ScheduledStep
from fides_rag.generation.engine.tickets import RequestHandle, Ticket
from fides_rag.generation.engine.views import DecoderLimits, DecoderStats
from fides_rag.generation.paths import Heads, masks_heads, paths_run
from fides_rag.generation.prompting import context_window
from fides_rag.generation.requests import Request
from fides_rag.method.lens import ModelAnatomy
from fides_rag.rules.base import ContrastRule

__all__ = ["Admission", "DecodeEngine", "EngineStats", "QueueFullError", "collect_eos_ids", "model_lock"]
IDLE_EXIT_S = 2.0
"""The engine's thread ends after this long with nothing to do (a new request starts it again)."""
EXIT_JOIN_S = 10.0
"""At interpreter exit, how long an engine's thread may take to finish its step and stop."""
_ENGINES: weakref.WeakSet[DecodeEngine] = weakref.WeakSet()
_EXITING = threading.Event()


@atexit.register
def _stop_engines_at_exit() -> None:
    """Engine threads stop at their next step boundary before the interpreter exits, so none is killed inside a
    torch kernel (which aborts the process with 'terminate called without an active exception')."""
    _EXITING.set()
    for engine in list(_ENGINES):
        engine._stop_at_exit()


_MODEL_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()


def model_lock(model: Any) -> threading.RLock:
    """The one lock of `model`: engines of several decoders on one model take turns at its steps."""
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


@dataclass
class EngineStats:
    """Counters of what the engine did (for tests, logs, metrics and benchmarks)."""

    requests: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    steps: int = 0
    tokens: int = 0
    admissions: int = 0
    """Steps at which requests joined."""
    largest_batch: int = 0
    """Most requests decoding in one step."""
    peak_rows: int = 0
    peak_queue: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of every row prefilled in chunks (each path's prompt counts)."""
    prefill_tokens: int = 0
    """Of those, the tokens computed (the rest came from the prefix cache)."""


def collect_eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every EOS id the tokenizer, the generation config and the model config declare."""
    ids: set[int] = set()
    sources = (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
    )
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


class DecodeEngine:
    """Continuous-batching decoder of `Request`s on one model.

    >>> engine = DecodeEngine(model, tokenizer, max_rows=64)
    >>> handle = engine.submit([request])[0]      # from any thread; `RequestBuilder` makes requests
    >>> handle.result()                           # a GenerationResult, as soon as this request finishes
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        split_prefill: bool = True,
        max_requests: int | None = None,
        max_rows: int | None = 128,
        max_tokens: int | None = None,
        max_queue: int | None = None,
        window_s: float = 0.0,
        admission: Admission = "continuous",
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = True,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        mode: Mode | None = None,
        compile: bool | str = False,
        buckets: Sequence[int] | None = None,
        kv_pool_tokens: int | None = None,
        prefix_block_size: int = DEFAULT_PREFIX_BLOCK_SIZE,
        kv_cache_memory: int | float | None = None,
        warmup: bool | Sequence[Any] = False,
        attention: str = "auto",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.anatomy = ModelAnatomy.of(model)
        self.eos_token_ids = collect_eos_ids(model, tokenizer)
        self.split_prefill = split_prefill
        """Encode each prompt row in its own forwards (exact; saves the no-context path's padding), in chunks under the
        step's token budget; False: every path of the newcomers in one forward at their admission step."""
        self.model_lock = model_lock(model)
        """Held for every step and for the rules' setup hooks (which may run the model); shared by every engine on
        this model, since the hooks that capture states and mask heads are installed on the model itself."""
        self.step_context: Callable[[], AbstractContextManager] | None = None
        """A context manager factory entered around every step on the engine's thread (profilers, torch modes)."""
        self.forward_context: Callable[[], AbstractContextManager] | None = None
        """A context manager factory entered around every decode step's backbone forward alone (`ForwardTimer`)."""
        self.stats = EngineStats()
        if max_num_batched_tokens is None:
            max_num_batched_tokens = DEFAULT_BATCHED_TOKENS.get(self.input_device.type, DEFAULT_BATCHED_TOKENS["cpu"])
        check_bounds(max_requests=max_requests, max_rows=max_rows, max_tokens=max_tokens, max_queue=max_queue)
        self.prefix_cache = PrefixCache(prefix_cache_bytes if prefix_caching else 0, prefix_block_size)
        """KV states of every full block of every prompt, reused by later prompts that start with them (bounded in
        bytes, LRU; blocks of `prefix_block_size` tokens, on which prefill chunks are cut with the cache on or off)."""
        self.chunked = split_prefill and mergeable(DecodeCache(config=self.anatomy.config))
        """Whether prompts are prefilled in chunks (their rows are held ragged); else in one forward at admission."""
        self.context_window = context_window(model.config, tokenizer)
        self.mode = resolve_mode(mode, self.input_device, model.config)
        """'exact': a greedy request's tokens do not depend on what else is in flight; 'fast': one attention call per
        layer over every row (see `modes.py`)."""
        check_mode_settings(
            self.mode,
            compile=compile,
            buckets=buckets,
            warmup=warmup,
            kv_pool_tokens=kv_pool_tokens,
            kv_cache_memory=kv_cache_memory,
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.pool_blocks: int | None = None
        """Fast mode's KV pool, in blocks of BLOCK positions (fixed; None in exact mode)."""
        if self.mode == "fast":
            self.pool_blocks = pool_blocks(
                self.anatomy.config,
                model.dtype,
                self.input_device,
                self.context_window,
                max_rows,
                kv_pool_tokens,
                kv_cache_memory,
            )
        self.attention = resolve_attention(attention, self.mode, self.input_device)
        """The attention backend of the decode step (`attention/`): chosen here, once."""
        self.captured = self._captured_step(compile, DEFAULT_BUCKETS if buckets is None else buckets)
        """The compiled decode step (`compile`), or None."""
        self.buckets: tuple[int, ...] | None = None
        """Row counts decode steps are padded to (a captured step's, or a static-batch backend's), or None."""
        if self.captured is not None:
            self.buckets = self.captured.buckets
        elif BACKENDS[self.attention].static_batch:
            self.buckets = check_buckets(DEFAULT_BUCKETS)
        self.pool_rows = 0
        """Rows one decode step of the pool may hold (its index buffers' size; 0 in exact mode)."""
        if self.pool_blocks is not None:
            largest = self.buckets[-1] if self.buckets is not None else 1
            self.pool_rows = max(largest, min(max_rows or self.pool_blocks, self.pool_blocks))
        self._check_rows_covered(max_rows)
        self.scheduler = Scheduler(
            max_num_batched_tokens=max_num_batched_tokens,
            context_window=self.context_window,
            block_manager=BlockManager(self.pool_blocks) if self.pool_blocks is not None else None,
            buckets=self.buckets,
            max_requests=max_requests,
            max_rows=max_rows,
            max_tokens=max_tokens,
            max_queue=max_queue,
            window_s=window_s,
            admission=admission,
        )
        """Every policy: the queue, admission within the bounds and the pool's blocks (it owns the block manager)."""
        self._flight = InFlight(
            self.anatomy,
            lambda: self._running_batch(pad, split_prefill),
            self.stats,
            self.decode_text,
            self._decode_token,
            self.prefix_cache,
            self.input_device,
            self.scheduler.block_manager,
        )
        self._wake = threading.Condition()
        self._driver: threading.Thread | None = None
        _ENGINES.add(self)

    def _check_rows_covered(self, max_rows: int | None) -> None:
        """Every step `max_rows` allows fits the pool's index buffers and, where steps are padded, a bucket."""
        self._check_within_pool_rows(max_rows)
        self._check_within_buckets(max_rows)

    def _check_within_pool_rows(self, max_rows: int | None) -> None:
        """Fast mode's index buffers hold `pool_rows` rows, fixed at construction: max_rows may not pass them."""
        if not self.pool_rows or self.pool_blocks is None:
            return  # exact mode: no pool
        rows = min(max_rows or self.pool_blocks, self.pool_blocks)  # no bound: as many rows as blocks
        if rows > self.pool_rows:
            raise ValueError(
                f"max_rows={max_rows!r}: fast mode's pool was sized for at most {self.pool_rows} rows a step when the "
                f"decoder was made; keep max_rows at most {self.pool_rows}, or make a decoder with the larger max_rows "
                "instead"
            )

    def _check_within_buckets(self, max_rows: int | None) -> None:
        """A backend that needs a static batch pads every step to a bucket: max_rows must be within the largest."""
        if not BACKENDS[self.attention].static_batch or self.buckets is None:
            return
        if max_rows is None or not fits_buckets(max_rows, self.buckets):
            raise ValueError(
                f"max_rows={max_rows!r}: attention={self.attention!r} pads every decode step to one of the buckets "
                f"{list(self.buckets)}, so max_rows must be at most {self.buckets[-1]}; lower max_rows or add a "
                "larger bucket (buckets=, with compile)"
            )

    def _captured_step(self, compile: bool | str, buckets: Sequence[int]) -> CapturedStep | None:
        backend, buckets = check_compile(compile), check_buckets(buckets)
        if backend is None:
            return None
        return CapturedStep(self.anatomy, backend, buckets, self.input_device)

    def warm_up(self, build: Callable[[Any], Request], methods: Sequence[Any], progress: bool = True) -> float:
        """Run the captured step at every bucket the scheduler can fill, with every hook set that `methods` in flight
        together can install (`build(method)`: a short request of that method), by decoding such requests: the graphs
        they need are compiled (two per hook set where the batch is dynamic, else one per bucket) and their CUDA
        graphs recorded; from then on a recompilation runs its step eagerly instead (`captured_fallback_steps`).
        Returns the seconds."""
        from tqdm.auto import tqdm

        if self.captured is None:
            raise ValueError("warm_up needs compile= (True or a torch.compile backend name) in mode='fast'")
        max_rows = self.scheduler.max_rows
        buckets = [b for b in self.captured.buckets if max_rows is None or b <= max_rows]
        jobs = [(b, group) for group in self._hook_groups(build, methods) for b in buckets]
        budget = self.scheduler.max_num_batched_tokens
        with self.captured.timed_warmup():
            try:
                for bucket, group in tqdm(jobs, desc="compile", unit="graph", disable=not progress, dynamic_ncols=True):
                    one_each = [build(m) for m in group]
                    rows = sum(self._rows(r) for r in one_each)
                    if rows > bucket:
                        continue  # these methods together never decode in so few rows
                    requests = [*one_each, *(build(m) for _ in range(bucket // rows - 1) for m in group)]
                    prompt = max(len(r.example.context_ids) for r in one_each)
                    self.configure(max_num_batched_tokens=max(budget, len(requests) * rows * (prompt + 1) + bucket))
                    for handle in self.submit(requests, wait_here=True):
                        handle.result()
            finally:
                self.configure(max_num_batched_tokens=budget)
        return self.captured.warmup_s or 0.0

    @staticmethod
    def _rows(request: Request) -> int:
        return sum(len(paths_run(run.effective, run.heads)) for run in request.decoded)

    def _hook_groups(self, build: Callable[[Any], Request], methods: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Every combination of `methods` that installs distinct hooks (one method per hook profile: the layers its
        rules capture, whether they mask heads), those that mask heads first (their hooks stay installed after)."""
        layers = len(self.anatomy.layers)
        profiles: dict[tuple[Any, ...], Any] = {}
        for method in methods:
            rules = [run.effective for run in build(method).decoded]
            profile = tuple((bool(r.layer_state_paths), tuple(r.lens_layers(layers)), masks_heads(r)) for r in rules)
            profiles.setdefault(profile, method)
        ordered = sorted(profiles.items(), key=lambda item: not any(masks for *_, masks in item[0]))
        chosen = [method for _, method in ordered]
        return [group for size in range(1, len(chosen) + 1) for group in itertools.combinations(chosen, size)]

    def _running_batch(self, pad: int, split_prefill: bool) -> Runner:
        """A new running decode over the mode's KV store: exact mode's ragged cache, or fast mode's pool."""
        store: KVStore = (
            RaggedStore(self.anatomy)
            if self.mode == "exact"
            else PooledStore(self.anatomy, self._pool_settings(), self._block_manager())
        )
        return Runner(
            self.anatomy,
            pad,
            self.input_device,
            split_prefill,
            store=store,
            forward_context=lambda: self.forward_context,
        )

    def _block_manager(self) -> BlockManager:
        manager = self.scheduler.block_manager
        if manager is None:
            raise RuntimeError("fast mode's store needs the scheduler's block manager, made with the pool's size")
        return manager

    def _pool_settings(self) -> PoolSettings:
        """Fast mode's pool as this engine sizes it."""
        blocks = self.pool_blocks or 1
        return PoolSettings(
            max_rows=self.pool_rows,
            max_row_blocks=math.ceil((self.context_window or blocks * BLOCK) / BLOCK) + 1,
            attention=self.attention,
            buckets=self.buckets or (),
            captured=self.captured,
        )

    # -- configuration ----------------------------------------------------------------------------

    def configure(self, **settings: Any) -> None:
        """Set any of the scheduler's settings (see `Scheduler.configure`): max_requests, max_rows, max_tokens,
        max_queue, window_s, admission, max_num_batched_tokens."""
        if "max_rows" in settings:
            self._check_rows_covered(settings["max_rows"])
        with self._wake:
            self.scheduler.configure(**settings)

    def limits(self) -> DecoderLimits:
        """The scheduler's bounds, the context window and the prefix cache's size, as they are now."""
        s = self.scheduler
        return DecoderLimits(
            max_requests=s.max_requests,
            max_rows=s.max_rows,
            max_tokens=s.max_tokens,
            max_queue=s.max_queue,
            max_num_batched_tokens=s.max_num_batched_tokens,
            window_s=s.window_s,
            admission=s.admission,
            context_window=self.context_window,
            split_prefill=self.split_prefill,
            prefix_cache_bytes=self.prefix_cache.max_bytes,
            prefix_block_size=self.prefix_cache.block_size,
            mode=self.mode,
            attention=self.attention,
        )

    def snapshot(self) -> DecoderStats:
        """The counters, what is in flight and the prefix cache's counters, as they are now."""
        cache = self.prefix_cache
        blocks = self.scheduler.block_manager
        return DecoderStats(
            **asdict(self.stats),
            queue_length=self.queue_length,
            requests_in_flight=self.requests_in_flight,
            rows_in_flight=self.rows_in_flight,
            prefix_cache_hits=cache.stats.hits,
            prefix_cache_misses=cache.stats.misses,
            prefix_cache_hit_tokens=cache.stats.hit_tokens,
            prefix_cache_evictions=cache.stats.evictions,
            prefix_cache_entries=len(cache),
            prefix_cache_bytes=cache.bytes,
            kv_pool_tokens=(self.pool_blocks or 0) * BLOCK,
            kv_pool_used_tokens=self._flight.pool_used_tokens,
            kv_pool_kept_tokens=blocks.kept * BLOCK if blocks is not None else 0,
            kv_pool_shared_tokens=blocks.counts.shared * BLOCK if blocks is not None else 0,
            kv_pool_copied_on_write=blocks.counts.copied_on_write if blocks is not None else 0,
            captured_fallback_steps=self.captured.fallback_steps if self.captured is not None else 0,
            captured_combine_lanes=self.captured.decide.compiled_lanes if self.captured is not None else 0,
            captured_combine_fallbacks=self.captured.decide.fallback_lanes if self.captured is not None else 0,
            warmup_s=self.captured.warmup_s if self.captured is not None else None,
        )

    @property
    def vocab_size(self) -> int:
        """The width of the model's logits (its output head's rows; may exceed the tokenizer's vocabulary)."""
        weight = getattr(self.anatomy.head, "weight", None)
        return int(weight.shape[0]) if weight is not None else int(self.anatomy.config.vocab_size)

    @property
    def input_device(self) -> torch.device:
        """Where input ids go: the input embeddings' device (the CPU when they are offloaded)."""
        weight = next(self.model.get_input_embeddings().parameters())
        return torch.device("cpu") if weight.device.type == "meta" else weight.device

    def decode_text(self, token_ids: list[int]) -> str:
        """Generated ids as text (special tokens dropped, spacing kept as generated)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # type: ignore[return-value]  # one sequence: a str

    def _decode_token(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)  # type: ignore[return-value]  # one sequence: a str

    def setup_heads(self, rules: Sequence[ContrastRule]) -> list[Heads | None]:
        """Run each rule's setup hook (under the model lock, as it may run the model): its masked attention heads
        (DeCoRe's head discovery), checked against the model. None where a rule masks no heads."""
        heads: list[Heads | None] = []
        if not any(masks_heads(rule) for rule in rules):
            return [None] * len(rules)  # nothing to run: a request's admission never waits for the steps in flight
        with self.model_lock:
            for rule in rules:
                asked = rule.masked_heads(self.model, self.tokenizer) if masks_heads(rule) else None
                checked = self.anatomy.check_heads(asked, f"method {rule.name!r}") if asked is not None else {}
                if checked:
                    self.anatomy.attention_output_projections()  # refuses a model whose heads cannot be masked
                heads.append(checked or None)
        return heads

    # -- submission -------------------------------------------------------------------------------

    @property
    def queue_length(self) -> int:
        """Requests waiting to be admitted."""
        return len(self.scheduler.queue)

    @property
    def requests_in_flight(self) -> int:
        """Requests admitted: decoding, or having their prompts prefilled."""
        return len(self._flight.tickets) + len(self._flight.prefilling)

    @property
    def rows_in_flight(self) -> int:
        return self._flight.batch.layout.num_rows

    def submit(self, requests: Sequence[Request], *, wait_here: bool = False) -> list[RequestHandle]:
        """Queue requests (admitted together when they fit); one handle each. Raises at once if one can never fit,
        or QueueFullError if the queue would pass max_queue.

        The engine's thread decodes them, unless `wait_here`: then the caller will wait on the handles (`result()`),
        and while no thread is decoding it decodes them itself, on its own thread (a single-threaded program then
        runs every tensor operation on its main thread, as with `model.generate`)."""
        if _EXITING.is_set() and not wait_here:
            raise RuntimeError(
                "the interpreter is exiting and the engine's thread has stopped; decode on this thread (generate)"
            )
        for request in requests:
            self.scheduler.check_fits(request)
        handles = [RequestHandle(r, self) for r in requests]
        tickets = [Ticket(h, self._units(h)) for h in handles]
        with self._wake:
            self.scheduler.add(tickets)
            self.stats.requests += len(tickets)
            self.stats.peak_queue = max(self.stats.peak_queue, len(self.scheduler.queue))
            if not wait_here:
                self._ensure_driver()
            self._wake.notify_all()
        return handles

    def _ensure_driver(self) -> None:
        """Start the engine's thread unless some thread is decoding (call with `_wake` held)."""
        if self._driver is None:
            self._driver = threading.Thread(target=self._serve, name="fides-engine", daemon=True)
            self._driver.start()

    @property
    def decoding_thread(self) -> threading.Thread | None:
        """The thread running the engine's steps now (its own, or a caller's), if any."""
        return self._driver

    def wait(self, handle: RequestHandle, timeout: float | None = None) -> Any:
        """`handle`'s result; a caller waiting while no thread decodes decodes itself until its request is done."""
        if threading.current_thread() is self._driver:
            raise RuntimeError(
                "a request cannot be awaited from the thread decoding it (e.g. inside a logits processor)"
            )
        with self._wake:
            drive = self._driver is None and not handle.done()
            if drive:
                self._driver = threading.current_thread()
        if drive:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._run(until=lambda: handle.done() or (deadline is not None and time.monotonic() >= deadline))
            finally:
                with self._wake:
                    self._driver = None
                    if self.scheduler.queue or self._flight.requests:
                        self._ensure_driver()  # others' requests go on
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
        return handle.future.result(timeout)

    def _units(self, handle: RequestHandle) -> list[Unit]:
        request = handle.request
        settings, example = request.settings, request.example
        units = []
        for index, run in enumerate(request.decoded):
            kinds = paths_run(run.effective, run.heads)
            head_set = self._head_set(run.heads) if any(kind.per_head_set for kind in kinds) else -1  # type: ignore[arg-type]  # such kinds mask heads
            units.append(
                Unit(
                    ticket=None,
                    index=index,
                    rows={kind.name: [] for kind in kinds},
                    prompt_ids=list(example.context_ids),
                    stop=request.text_stops,
                    max_new_tokens=settings.max_new_tokens,
                    text=IncrementalText(self.decode_text),
                    seed=settings.seed,
                    head_set=head_set,
                    processors=settings.unit_processors(),
                    min_new_tokens=settings.min_new_tokens,
                    eos_ids=tuple(sorted(self.eos_token_ids)),
                    criteria=settings.stopping_criteria or None,
                    grammar=request.constraint.start() if request.constraint is not None else None,
                    logprobs=settings.logprobs,
                )
            )
        return units

    def _head_set(self, heads: Heads) -> int:
        with self._wake:
            return self._flight.head_set(heads)

    # -- the engine's thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        self._run(until=None)

    def _stop_at_exit(self) -> None:
        with self._wake:
            driver = self._driver if self._driver is not None and self._driver.name == "fides-engine" else None
            self._wake.notify_all()
        if driver is not None and driver is not threading.current_thread():
            driver.join(EXIT_JOIN_S)

    def _run(self, until: Callable[[], bool] | None) -> None:
        """Steps until `until()` holds (a caller decoding its own request) or, on the engine's thread, until idle."""
        while not (until is not None and until()):
            plan = self._next_step(wait=until is None)
            if plan is None:
                return
            try:
                with (
                    self.model_lock,
                    torch.inference_mode(),
                    per_segment_attention(self.anatomy.backbone),
                    (self.step_context or contextlib.nullcontext)(),
                ):
                    if self.chunked:
                        self.prefix_cache.bind(self.model, self.tokenizer)
                    self._flight.step(plan, self.eos_token_ids, self.model.dtype, self.scheduler.release)
            except BaseException as error:  # a failed forward fails what was decoding, not the engine
                self._flight.fail_all(error, [*plan.newcomers, *self.scheduler.drop_held()])
                if not isinstance(error, Exception):  # KeyboardInterrupt in a caller's thread: stop there
                    raise

    def _next_step(self, wait: bool) -> ScheduledStep | None:
        """The scheduler's plan of the step at this boundary (it may admit no newcomer); None: nothing to do (the
        engine's thread ends after IDLE_EXIT_S of it)."""
        scheduler = self.scheduler
        with self._wake:
            while (not scheduler.queue and not self._flight.requests) or (wait and _EXITING.is_set()):
                if (
                    not wait
                    or _EXITING.is_set()
                    or (not self._wake.wait(IDLE_EXIT_S) and not scheduler.queue and not self._flight.requests)
                ):
                    if wait:
                        self._driver = None
                    return None
            return scheduler.schedule(
                self._flight, chunked=self.chunked, wait_for=self._wake.wait_for, on_cancelled=self._cancelled_in_queue
            )

    def _cancelled_in_queue(self, ticket: Ticket) -> None:
        self.stats.cancelled += 1
        ticket.close_cancelled()
