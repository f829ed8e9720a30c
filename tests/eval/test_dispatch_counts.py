"""DispatchCounter counts aten ops and the bytes they write; views write nothing; copies, cats and pads are traffic."""

from __future__ import annotations

import torch

from fides_rag.eval.dispatch_counts import DispatchCounter


def test_cat_copy_and_pad_bytes_are_counted_as_traffic_and_views_as_nothing():
    a, b = torch.ones(4, 8, dtype=torch.float32), torch.ones(2, 8, dtype=torch.float32)
    out = torch.empty(6, 8, dtype=torch.float32)
    with DispatchCounter() as counter:
        torch.cat([a, b])  # 6 * 8 * 4 bytes
        out[:4].copy_(a)  # a slice (a view, 0 bytes), then 4 * 8 * 4 bytes written into it
        torch.nn.functional.pad(b, (0, 0, 1, 0))  # 3 * 8 * 4 bytes
        a.t()  # a view
        a * 2  # arithmetic: counted as an op, not as traffic
    traffic = counter.totals.traffic()
    assert (traffic["cat"], traffic["copy"], traffic["pad"]) == (192, 128, 96), counter.totals.ops
    assert traffic["total"] == 192 + 128 + 96
    assert counter.totals.bytes["t"] == 0 and counter.totals.bytes["mul"] == 128
    assert counter.totals.ops["cat"] == 1 and counter.totals.op_count >= 5


def test_totals_accumulate_over_entries_and_subtract_to_the_difference():
    counter = DispatchCounter()
    with counter:
        torch.cat([torch.ones(2, dtype=torch.float32), torch.ones(2, dtype=torch.float32)])
    first = counter.totals.copy()
    with counter:
        torch.cat([torch.ones(4, dtype=torch.float32), torch.ones(4, dtype=torch.float32)])
    step = counter.totals - first
    assert step.ops["cat"] == 1 and step.traffic()["cat"] == 32
    assert counter.totals.traffic()["cat"] == 48
