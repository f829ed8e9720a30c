"""Counting what a piece of code asks the tensor library to do: every aten op that reaches the dispatcher, and the
bytes each op writes, through a `TorchDispatchMode`. The counts depend on the code, the model's shapes and the
prompts, not on the machine's speed, so they can be compared across machines and runs.

Bytes written are the bytes of each op's tensor outputs (for an in-place op, the view it wrote into). View ops
(slices, reshapes, transposes) write nothing and count 0 bytes. `TRAFFIC_OPS` names the ops that only move data:
copies, concatenations and padding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

TRAFFIC_OPS: dict[str, str] = {
    "copy_": "copy",
    "_to_copy": "copy",
    "clone": "copy",
    "copy": "copy",
    "_copy_from": "copy",
    "cat": "cat",
    "stack": "cat",
    "constant_pad_nd": "pad",
    "pad": "pad",
}
"""aten op name -> traffic kind ("copy", "cat" or "pad"): the ops whose only work is to write data elsewhere."""


def _written(func: Any, out: Any) -> int:
    if getattr(func, "is_view", False):
        return 0
    return sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


@dataclass
class DispatchTotals:
    """What ran while counting: op calls and bytes written per aten op name."""

    ops: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)

    def copy(self) -> DispatchTotals:
        return DispatchTotals(Counter(self.ops), Counter(self.bytes))

    def __sub__(self, other: DispatchTotals) -> DispatchTotals:
        ops, written = Counter(self.ops), Counter(self.bytes)
        ops.subtract(other.ops)
        written.subtract(other.bytes)
        return DispatchTotals(+ops, +written)

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    def traffic(self) -> dict[str, int]:
        """Bytes written by copy, cat and pad ops, per kind and in total."""
        kinds = {"copy": 0, "cat": 0, "pad": 0}
        for name, written in self.bytes.items():
            kind = TRAFFIC_OPS.get(name)
            if kind is not None:
                kinds[kind] += written
        return {**kinds, "total": sum(kinds.values())}


class DispatchCounter(TorchDispatchMode):
    """Counts aten ops and the bytes they write while active (on the thread that entered it; torch modes are per
    thread). It can be entered and left many times; the totals accumulate.

    >>> counter = DispatchCounter()
    >>> with counter:
    ...     model(ids)
    >>> counter.totals.op_count, counter.totals.traffic()["total"]
    """

    def __init__(self) -> None:
        super().__init__()
        self.totals = DispatchTotals()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.totals.ops[name] += 1
        written = _written(func, out)
        if written:
            self.totals.bytes[name] += written
        return out
