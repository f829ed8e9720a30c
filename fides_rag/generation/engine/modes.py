"""The engine's two modes.

- `exact`: a greedy request gives the same tokens whatever else is in flight. Each group of rows of one length is
  attended on its own (`ragged_attention.py`), and on the CPU a row's matmul results do not depend on the other rows.
  The default on the CPU, and the eval harness's.
- `fast`: one attention call per layer over every row of every request (`kv_pool.py`, `pooled_attention.py`): a
  decode step's aten ops do not grow with the requests in flight. A row's attention runs over its own blocks of a
  fixed pool, batched with the other rows, so its floating-point sums can differ from exact mode's in the last bits,
  and a close argmax can flip.
  The default on accelerators.

Exact mode is refused on accelerators: their matmul and attention kernels choose their splits by batch shape, so a
row's result can depend on what else is in flight, and fides-rag has no batch-invariant kernels for them yet.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

Mode = Literal["exact", "fast"]
MODES: tuple[str, ...] = ("exact", "fast")


def resolve_mode(mode: Any, device: torch.device, config: Any) -> Mode:
    """The mode to run: `mode` checked against the device and model, or the device's default when None."""
    from fides_rag.generation.engine.pooled_store import pool_supported

    if mode is None:
        mode = "exact" if device.type == "cpu" else "fast"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)} (or None: exact on the CPU, fast elsewhere), got {mode!r}")
    if mode == "exact" and device.type != "cpu":
        raise ValueError(
            f"mode='exact' needs batch-invariant matmul and attention kernels, which fides-rag has on the CPU only; on "
            f"{device.type} use mode='fast' (its agreement with exact mode is measured by benchmarks/fast_agreement.py)"
        )
    if mode == "fast":
        reason = pool_supported(config)
        if reason is not None:
            raise ValueError(f"mode='fast' cannot run this model: {reason}; use mode='exact'")
    return mode


def check_mode_settings(
    mode: Mode,
    *,
    compile: object = False,
    buckets: object = None,
    warmup: object = False,
    kv_pool_tokens: object = None,
    kv_cache_memory: object = None,
) -> None:
    """Refuse a setting that would have no effect in `mode`, naming the setting and the mode that uses it: a user who
    sets a pool expects a pool, or an error, never a setting dropped in silence."""
    if mode == "exact":
        for name, value in (("kv_pool_tokens", kv_pool_tokens), ("kv_cache_memory", kv_cache_memory)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} sizes fast mode's KV pool, but mode='exact' (the CPU's default) keeps each "
                    f"request's own cache and no pool; drop {name}, or pass mode='fast'"
                )
        if compile not in (False, None):
            raise ValueError(
                f"compile={compile!r} captures fast mode's decode step, but mode='exact' attends each group of rows "
                "on its own, in shapes that change every step; drop compile, or pass mode='fast'"
            )
    if compile in (False, None):
        if buckets is not None:
            raise ValueError(
                f"buckets={buckets!r} are the row counts compile= captures the decode step at; without compile they "
                "have no effect: drop buckets, or pass compile=True (mode='fast')"
            )
        if warmup not in (False, None):
            raise ValueError(
                f"warmup={warmup!r} needs compile= (True or a torch.compile backend name) in mode='fast': it "
                "compiles the captured decode step's buckets at start-up"
            )
