"""The captured decode step of fast mode: the backbone's one-token forward over every row, compiled with
`torch.compile(fullgraph=True)` (CUDA graphs on CUDA, mode "reduce-overhead", a graph recorded per bucket).

A step of R rows runs at the smallest bucket that holds them: rows past R are padding (the pad token at position 0,
writing and reading the pool's scratch slot only) and their outputs are dropped, so requests join and leave without a
recompilation. Where the attention backend needs no static batch (the gather), the rows are a dynamic dimension: one
graph serves every bucket past 1 (dynamo always specializes a size of 1), and warm-up compiles two graphs per hook set
whatever the bucket count; a static-batch backend (flex) compiles one per bucket. The pool is fixed in size, so its
shape never changes. The pool's tensors, written in place by every step, are marked static
(`torch._dynamo.mark_static_address`), so CUDA graphs are not skipped for inputs mutated in place. Steps of more rows
than the largest bucket run eagerly (the same tokens: compiling changes no result).

A compilation that fails, or a recompilation after warm-up (`warmed`), never fails a request: that step runs eagerly
(the same tokens), as does every later step of its bucket and hooks; `fallback_steps` counts such steps and the log
says why once per reason.
"""

from __future__ import annotations

import contextlib
import logging
import time
import types
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from fides_rag.generation.engine.captured_decide import CapturedDecide
from fides_rag.method.lens import ModelAnatomy

if TYPE_CHECKING:
    from fides_rag.generation.engine.kv_pool import PooledCache

logger = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, *range(16, 257, 16))
"""Row counts a decode step is captured at (nano-vllm's: 1, 2, 4, 8, then every 16)."""
HOOK_SETS = 8
"""Hook sets one bucket may be compiled with (the layers a method's rule captures, heads masked or not)."""
MASK_KINDS = 2
"""Mask forms one bucket may be compiled with (one mask, or one per layer type)."""


def check_buckets(buckets: Any) -> tuple[int, ...]:
    """`buckets` checked: strictly increasing positive integers."""
    values = tuple(buckets) if isinstance(buckets, (list, tuple)) else None
    if (
        not values
        or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in values)
        or any(a >= b for a, b in zip(values, values[1:]))
    ):
        raise ValueError(
            "buckets must be a non-empty sequence of strictly increasing positive integers (row counts), got "
            f"{buckets!r}"
        )
    return values


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    """The smallest of `buckets` (strictly increasing, `check_buckets`) that holds `rows` rows; raises past the largest
    (a caller that can run unpadded tests `fits_buckets` first)."""
    found = next((b for b in buckets if b >= rows), None)
    if found is None:
        largest = buckets[-1] if buckets else None
        raise RuntimeError(
            f"{rows} rows, more than the largest bucket {largest}: max_rows caps the rows of a step that must be "
            "padded to a bucket (lower max_rows or add a larger bucket)"
        )
    return found


def fits_buckets(rows: int, buckets: Sequence[int]) -> bool:
    """Whether some bucket of `buckets` holds `rows` rows."""
    return bool(buckets) and rows <= buckets[-1]


def check_compile(compile: Any) -> str | None:
    """The torch.compile backend of `compile` (True: inductor), or None when off."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "inductor"
    if isinstance(compile, str) and compile:
        return compile
    raise ValueError(
        "compile must be True, False or the name of a torch.compile backend (e.g. 'inductor', 'eager'), got "
        f"{compile!r}"
    )


def _reason(error: BaseException) -> str:
    """A one-line account of why a captured step could not run."""
    if isinstance(error, torch._dynamo.exc.RecompileError) or "stance is 'fail_on_recompile'" in str(error):
        kind = "a recompilation was refused (after warm-up, or under the fail_on_recompile stance)"
    elif isinstance(error, torch._dynamo.exc.FailOnRecompileLimitHit):
        kind = "dynamo's recompile limit was hit"
    else:
        kind = "its compilation failed"
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    guards = [
        line.removeprefix("- ") for line in lines if "guard failure" not in line and not line.startswith("- User")
    ]
    said = "; ".join(guards[:4])[:600]  # the message's first line and the guards that failed
    return f"{kind} ({type(error).__name__}: {said})"


class CapturedStep:
    """The compiled one-token forward, the bucket each row count runs at, and the steps that fell back to eager."""

    def __init__(self, anatomy: ModelAnatomy, backend: str, buckets: Sequence[int], device: torch.device) -> None:
        self.anatomy = anatomy
        self.backend = backend
        self.buckets = tuple(buckets)
        self.recompile_limit = len(self.buckets) * HOOK_SETS * MASK_KINDS
        """Graphs dynamo may keep of the step: buckets x hook sets x mask kinds."""
        options: dict[str, Any] = {"fullgraph": True, "dynamic": False, "backend": backend}
        if backend == "inductor" and device.type == "cuda":
            options["mode"] = "reduce-overhead"  # CUDA graphs
        # A code object of its own: dynamo keeps its graphs, and counts its recompiles, per code object, so decoders
        # sharing `_step`'s code would share one recompile limit and one graph cache.
        own = types.FunctionType(CapturedStep._step.__code__.replace(), CapturedStep._step.__globals__, "_step")
        self._forward = torch.compile(types.MethodType(own, self), **options)
        self.decide = CapturedDecide(backend)
        """Each eligible lane's combine and greedy choice, compiled (`captured_decide.py`)."""
        self.warmed = False
        """Set after warm-up: from then on a recompilation is refused, and its step runs eagerly."""
        self.warmup_s: float | None = None
        """Seconds the warm-up took (None: none ran)."""
        self.fallback_steps = 0
        """Steps of a bucket that ran eagerly because its graph could not be compiled or run."""
        self._failed: dict[tuple[Any, ...], str] = {}  # (bucket, hooks) -> why it runs eagerly
        self._warned: set[str] = set()
        self._projections: list[torch.nn.Module] | None = None

    def _step(self, ids: torch.Tensor, mask: Any, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.anatomy.run_backbone(ids, mask, positions, cache)[0]

    def bucket(self, rows: int) -> int | None:
        """The smallest bucket that holds `rows` rows (None: more than the largest; the step runs eagerly)."""
        return bucket_for(rows, self.buckets) if fits_buckets(rows, self.buckets) else None

    def _hooks(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The blocks with forward hooks (layer capture) and attention projections with pre-hooks (head masks)."""
        if self._projections is None:
            try:
                self._projections = list(self.anatomy.attention_output_projections())
            except (AttributeError, TypeError, ValueError):
                self._projections = []
        return (
            tuple(i for i, layer in enumerate(self.anatomy.layers) if layer._forward_hooks),
            tuple(i for i, p in enumerate(self._projections) if p._forward_pre_hooks),
        )

    @staticmethod
    def mark_static(tensors: Sequence[torch.Tensor]) -> None:
        """Mark tensors the step reads or writes in place as static inputs (once each)."""
        for tensor in tensors:
            if getattr(tensor, "_dynamo_static_input_type", None) is None:
                torch._dynamo.mark_static_address(tensor)

    def __call__(self, ids: torch.Tensor, mask: Any, positions: torch.Tensor, cache: PooledCache) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:
            # A dispatch mode (counting aten ops) sees every op, which a graph replay hides; it also changes what
            # dynamo guards on. Such a step runs eagerly and leaves its bucket's graph as it is.
            return self._step(ids, mask, positions, cache)
        pool = cache.pool
        self.mark_static(pool.static_tensors())
        for tensor, dim in pool.attention.dynamic_dims():  # sizes that follow the rows' lengths (and the rows)
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        if not pool.attention.static_batch:  # one graph for every bucket past 1 (a size of 1 is always its own)
            torch._dynamo.maybe_mark_dynamic(ids, 0)
            torch._dynamo.maybe_mark_dynamic(positions, 0)
        key = (ids.shape[0], self._hooks())
        if key in self._failed:
            self.fallback_steps += 1
            return self._step(ids, mask, positions, cache)
        # The hooks that capture layer states and mask heads are part of the step: guard on them, so that a step with
        # other hooks never runs a graph traced without them.
        limits: dict[str, Any] = {
            "skip_nnmodule_hook_guards": False,
            "recompile_limit": self.recompile_limit,
            "accumulated_recompile_limit": max(torch._dynamo.config.accumulated_recompile_limit, self.recompile_limit),
        }
        try:
            stance = torch.compiler.set_stance("fail_on_recompile") if self.warmed else contextlib.nullcontext()
            with torch._dynamo.config.patch(**limits), stance:
                return self._forward(ids, mask, positions, cache)
        except Exception as error:  # compiling changes no result: the step runs eagerly instead
            reason = _reason(error)
            self._failed[key] = reason
            if reason not in self._warned:
                self._warned.add(reason)
                logger.warning("the captured decode step of %d rows runs eagerly from now on: %s", key[0], reason)
        self.fallback_steps += 1
        return self._step(ids, mask, positions, cache)

    @contextlib.contextmanager
    def timed_warmup(self) -> Iterator[None]:
        """Around a warm-up: records its seconds in `warmup_s` and sets `warmed` when it succeeds."""
        start = time.perf_counter()
        yield
        self.warmup_s = time.perf_counter() - start
        self.warmed = True
        logger.info("compiled the captured decode step's buckets in %.1f s", self.warmup_s)
