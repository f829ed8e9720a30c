"""The step-budget sweep: continuous serving of one request mix at one load under each `max_num_batched_tokens`, to
choose the engine's default for a device.

The sequential capacity is measured once, under the engine's budget when the sweep starts, so every budget sees the
same arrival schedule. The report says whether the greedy tokens are equal under every budget. They need not be: the
budget sets where long prompts are cut into prefill chunks, and other forwards may round a near tie the other way (under
one budget, tokens are the same alone and under load).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fides_rag.decoder import FidesDecoder, check_batched_tokens
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.serving import ServingBench


def budget_sweep(
    decoder: FidesDecoder,
    examples: Sequence[QAExample],
    *,
    budgets: Sequence[int],
    load: float = 1.0,
    n_requests: int = 32,
    tokens: tuple[int, int] = (8, 64),
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Continuous serving at `load` times the sequential capacity under each budget; the engine's budget and admission
    are restored afterwards. `best` is the budget with the lowest p95 latency."""
    budgets = [check_batched_tokens(b) for b in budgets]
    if not budgets:
        raise ValueError("budget_sweep needs at least one budget, e.g. budgets=(128, 256, 512)")
    default = decoder.limits.max_num_batched_tokens
    bench = ServingBench(decoder, examples, n_requests=n_requests, tokens=tokens)
    capacity = bench.capacity()
    log(f"sequential capacity {capacity:.3f} requests/s under a budget of {default} tokens")
    report: dict[str, Any] = {
        "load": load,
        "requests": n_requests,
        "tokens": list(tokens),
        "capacity_per_s": capacity,
        "default": default,
        "budgets": {},
    }
    outputs = []
    try:
        for budget in budgets:
            decoder.configure(max_num_batched_tokens=budget)
            run = bench.run("continuous", load * capacity)
            outputs.append(run.pop("token_ids"))
            report["budgets"][str(budget)] = {
                k: run[k] for k in ("ttft_s", "latency_s", "examples_per_s", "tokens", "prefill")
            }
            log(
                f"budget {budget}: p95 latency {run['latency_s']['p95']:.2f} s, TTFT p50 {run['ttft_s']['p50']:.2f} s, "
                f"{run['examples_per_s']:.3f} ex/s"
            )
    finally:
        decoder.configure(max_num_batched_tokens=default)
        bench.configure("continuous")
    report["identical_outputs"] = all(o == outputs[0] for o in outputs)
    report["best"] = int(min(report["budgets"], key=lambda b: report["budgets"][b]["latency_s"]["p95"]))
    return report


def format_budget_sweep(data: dict[str, Any]) -> str:
    """A markdown table of a sweep."""
    lines = [
        f"{data['requests']} FIDES requests of {data['tokens'][0]}-{data['tokens'][1]} new tokens, Poisson arrivals at "
        f"{data['load']}x the sequential capacity ({data['capacity_per_s']:.3f} requests/s under {data['default']} "
        "tokens), "
        f"continuous batching; same tokens under every budget: {data['identical_outputs']}.",
        "",
        "| max_num_batched_tokens | TTFT p50 s | TTFT p95 s | latency p50 s | latency p95 s | examples/s |",
        "|---|---|---|---|---|---|",
    ]
    for budget, d in data["budgets"].items():
        mark = " (lowest p95)" if int(budget) == data["best"] else ""
        lines.append(
            f"| {budget}{mark} | {d['ttft_s']['p50']:.2f} | {d['ttft_s']['p95']:.2f} | {d['latency_s']['p50']:.2f} | "
            f"{d['latency_s']['p95']:.2f} | {d['examples_per_s']:.3f} |"
        )
    return "\n".join(lines)
