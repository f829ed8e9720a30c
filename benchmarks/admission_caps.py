"""Does capping continuous batching shorten its latency tail? The serving benchmark's mix (32 FIDES requests of 8-64
tokens, NQ-Swap questions with their documents, Poisson arrivals at one load) served continuously under caps on how
many requests decode at once, and in static batches of up to 8, on one arrival schedule.

On one CPU thread a decode step of many rows costs more than a step of few, so a long request pays for every newcomer
decoding beside it; a cap bounds that, at the cost of newcomers waiting for a place.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/admission_caps.py \\
        --out results/admission-caps/smollm2-135m-instruct.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

from fides_rag import FidesConfig, FidesDecoder
from fides_rag.eval.datasets import load_nq_swap
from fides_rag.eval.serving import ServingBench
from fides_rag.models.loading import load_model


def sweep(model: str, caps: list[int | None], load: float, requests: int, device: str) -> dict[str, Any]:
    """p50/p95 TTFT and latency under each cap (None: none), and static batches, at `load` times sequential capacity."""
    network, tokenizer = load_model(model, device=device)
    bench = ServingBench(
        FidesDecoder(network, tokenizer, config=FidesConfig()), load_nq_swap(None), n_requests=requests
    )
    capacity = bench.capacity()
    runs: dict[str, Any] = {}
    outputs = []
    for cap in caps:
        run = bench.run("continuous", load * capacity, max_requests=cap)
        outputs.append(run.pop("token_ids"))
        runs["none" if cap is None else str(cap)] = run
        print(f"cap {cap}: p95 latency {run['latency_s']['p95']:.2f} s", flush=True)
    static = bench.run("static", load * capacity)
    outputs.append(static.pop("token_ids"))
    runs["static"] = static
    bench.configure("continuous")
    return {
        "model": model,
        "load": load,
        "requests": requests,
        "capacity_per_s": capacity,
        "static_batch": bench.static_batch,
        "machine": platform.platform(),
        "identical_outputs": all(o == outputs[0] for o in outputs),
        "runs": runs,
    }


def markdown(data: dict[str, Any]) -> str:
    static_p95 = data["runs"]["static"]["latency_s"]["p95"]
    lines = [
        "| admission | TTFT p50 s | TTFT p95 s | latency p50 s | latency p95 s | p95 / static's |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in data["runs"].items():
        label = {"none": "continuous, no cap", "static": f"static batches of up to {data['static_batch']}"}.get(
            name, f"continuous, at most {name}"
        )
        t, lat = run["ttft_s"], run["latency_s"]
        lines.append(
            f"| {label} | {t['p50']:.2f} | {t['p95']:.2f} | {lat['p50']:.2f} | {lat['p95']:.2f} | "
            f"{lat['p95'] / static_p95:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--caps", default="none,2,4,8", help="comma-separated caps; none: no cap (default: %(default)s)"
    )
    parser.add_argument("--load", type=float, default=1.0, help="in sequential capacities (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=32, help="default: %(default)s")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.caps.split(",")]
    if not all(c == "none" or (c.isdigit() and int(c) >= 1) for c in names):
        parser.error(f"--caps must be positive integers or none, got {args.caps}")
    caps = [None if c == "none" else int(c) for c in names]
    data = sweep(args.model, caps, args.load, args.requests, args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(data) + "\n")
    print(markdown(data))


if __name__ == "__main__":
    main()
