"""Whether one padded attention call gives a request the same bits as attending its own keys alone.

The engine attends each cache segment with its own call (exact: a request's attention never sees another's keys,
padded or not). One call over all segments would pad every segment to the longest and mask the padding. This checks,
with `torch.nn.functional.scaled_dot_product_attention` on this machine, whether a one-token query over T keys padded
with P masked positions (on the right or on the left) is bitwise equal to the same query over the T keys with an
all-true mask, for several T and P:

    python benchmarks/padded_attention.py --out results/padded-attention/cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

LENGTHS = (17, 100, 257, 1000, 2049)
PADS = (1, 7, 64, 300)


def padded(
    keys: torch.Tensor, values: torch.Tensor, pad: int, side: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`keys`, `values` ([1, heads, T, d]) with `pad` zero positions on `side`, and the mask that hides them."""
    zeros = keys.new_zeros((*keys.shape[:2], pad, keys.shape[-1]))
    length = keys.shape[-2]
    mask = torch.zeros(1, 1, 1, length + pad, dtype=torch.bool, device=keys.device)
    if side == "right":
        mask[..., :length] = True
        return torch.cat([keys, zeros], 2), torch.cat([values, zeros], 2), mask
    mask[..., pad:] = True
    return torch.cat([zeros, keys], 2), torch.cat([zeros, values], 2), mask


def check(dtype: torch.dtype, device: torch.device, heads: int = 8, dim: int = 64) -> dict[str, Any]:
    """How many (T, P) cases are bitwise equal, per padding side."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    equal = {"right": 0, "left": 0}
    cases = 0
    for length in LENGTHS:
        for pad in PADS:
            q, k, v = (
                torch.randn(1, heads, n, dim, generator=generator).to(device, dtype) for n in (1, length, length)
            )
            alone = F.scaled_dot_product_attention(
                q, k, v, attn_mask=torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
            )
            for side in equal:
                kp, vp, mask = padded(k, v, pad, side)
                equal[side] += torch.equal(F.scaled_dot_product_attention(q, kp, vp, attn_mask=mask), alone)
            cases += 1
    return {"cases": cases, "bitwise_equal": equal}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="JSON results file (default: print only)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "lengths": LENGTHS,
        "pads": PADS,
        "dtypes": {str(d).removeprefix("torch."): check(d, device) for d in (torch.float32, torch.bfloat16)},
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for dtype, found in report["dtypes"].items():
        print(
            f"{dtype}: right-padded equal in {found['bitwise_equal']['right']}/{found['cases']}, "
            f"left-padded in {found['bitwise_equal']['left']}/{found['cases']}"
        )


if __name__ == "__main__":
    main()
