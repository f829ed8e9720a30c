"""The captured decode step of fast mode: the backbone's one-token forward over every row, compiled once per batch
bucket with `torch.compile(fullgraph=True)` (CUDA graphs on CUDA, mode "reduce-overhead").

A step of R rows runs at the smallest bucket that holds them: rows past R are padding (the pad token at position 0,
writing and reading the pool's scratch slot only) and their outputs are dropped. Shapes are static within a bucket, so
requests of one bucket join and leave without a recompilation; a pool that doubles is a new shape, compiled once more.
Steps of more rows than the largest bucket run eagerly (the same tokens: compiling changes no result).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fides_rag.method.lens import ModelAnatomy

DEFAULT_BUCKETS = (1, 2, 4, 8, *range(16, 257, 16))
"""Row counts a decode step is captured at (nano-vllm's: 1, 2, 4, 8, then every 16)."""


def check_buckets(buckets: Any) -> tuple[int, ...]:
    """`buckets` checked: strictly increasing positive integers."""
    values = tuple(buckets) if isinstance(buckets, (list, tuple)) else None
    if (not values or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in values)
            or any(a >= b for a, b in zip(values, values[1:]))):
        raise ValueError("buckets must be a non-empty sequence of strictly increasing positive integers (row counts), got " f"{buckets!r}")
    return values


def check_compile(compile: Any) -> str | None:
    """The torch.compile backend of `compile` (True: inductor), or None when off."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "inductor"
    if isinstance(compile, str) and compile:
        return compile
    raise ValueError("compile must be True, False or the name of a torch.compile backend (e.g. 'inductor', 'eager'), got " f"{compile!r}")


class CapturedStep:
    """The compiled one-token forward, and the bucket each row count runs at."""

    def __init__(self, anatomy: ModelAnatomy, backend: str, buckets: Sequence[int], device: torch.device) -> None:
        self.anatomy = anatomy
        self.buckets = tuple(buckets)
        options: dict[str, Any] = {"fullgraph": True, "dynamic": False, "backend": backend}
        if backend == "inductor" and device.type == "cuda":
            options["mode"] = "reduce-overhead"  # CUDA graphs
        self._forward = torch.compile(self._step, **options)

    def _step(self, ids: torch.Tensor, mask: Any, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.anatomy.run_backbone(ids, mask, positions, cache)[0]

    def bucket(self, rows: int) -> int | None:
        """The smallest bucket that holds `rows` rows (None: more than the largest; the step runs eagerly)."""
        return next((b for b in self.buckets if b >= rows), None)

    def __call__(self, ids: torch.Tensor, mask: Any, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        # The hooks that capture layer states and mask heads are part of the step: guard on them, so that a step with
        # other hooks never runs a graph traced without them.
        with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
            return self._forward(ids, mask, positions, cache)
