"""The output head's matmul on CPU for 2-8 rows, unpadded and padded with zero rows, at the bundled backbones'
head shapes (random weights: only the shapes matter). It shows why `ModelAnatomy.head_logits` pads 3 rows
to 4: MKL's narrow sgemm runs 4 columns faster than 3. Median and min of 7 rounds (--rounds) of 4 products each,
cases interleaved so the machine's drift hits all alike.

    python benchmarks/head_rows.py --out results/head-rows/head-rows.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fides_rag.eval.bench import machine

HEADS = {"gemma3-270m": (262144, 640), "smollm2-135m-instruct": (49152, 576)}
CASES = ((2, 2), (3, 3), (3, 4), (4, 4), (5, 5), (5, 6), (6, 6), (8, 8))  # (rows, padded to)


def product(weight: torch.Tensor, states: torch.Tensor, padded_to: int) -> torch.Tensor:
    rows = states.shape[0]
    if padded_to > rows:
        states = torch.cat([states, states.new_zeros(padded_to - rows, states.shape[1])])
    return (weight @ states.T)[:, :rows].T.contiguous()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of 4 products per case (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the medians and every sample as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    weights = {name: torch.randn(*shape) for name, shape in HEADS.items()}
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, weight in weights.items():
            for rows, padded_to in CASES:
                states = torch.randn(rows, weight.shape[1])
                product(weight, states, padded_to)
                start = time.perf_counter()
                for _ in range(4):
                    product(weight, states, padded_to)
                samples.setdefault(f"{name} {rows} rows -> {padded_to}", []).append(
                    (time.perf_counter() - start) / 4 * 1000
                )
    report = {
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "ms": {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2)} for k, v in samples.items()},
    }
    for case, ms in report["ms"].items():
        print(f"{case:40s} median {ms['median']:7.1f} ms   min {ms['min']:7.1f} ms")
    if args.out:
        args.out.write_text(json.dumps(report | {"samples_ms": samples}, indent=1) + "\n")


if __name__ == "__main__":
    main()
