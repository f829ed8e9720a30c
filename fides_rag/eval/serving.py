"""The serving benchmark: an open-loop Poisson arrival of FIDES requests of mixed lengths, at fractions and
multiples of the sequential capacity, decoded by the engine in three modes in one process:

- continuous: requests join the running decode at the next step and leave when they finish;
- static: a batch (up to `static_batch` requests gathered in a short window) runs to its end, and its results
  are released together, as a static request batcher does;
- sequential: one request at a time, first come first served.

Requests arrive on schedule whatever the engine is doing (open loop), so queueing shows in the latencies.
Each request is forced to its length (min_new_tokens, no stop strings) so that the mix is what was asked.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fides_rag.decoder import DecoderStats, FidesDecoder, RequestHandle
from fides_rag.eval.datasets import QAExample

MODES = ("continuous", "static", "sequential")


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return {"p50": float(p50), "p95": float(p95), "mean": float(np.mean(values))}


class ServingBench:
    """One decoder, one request mix, several loads and modes."""

    def __init__(
        self,
        decoder: FidesDecoder,
        examples: Sequence[QAExample],
        *,
        n_requests: int = 64,
        tokens: tuple[int, int] = (8, 64),
        method: str = "fides",
        static_batch: int = 8,
        seed: int = 0,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.decoder = decoder
        self.method = method
        self.static_batch = static_batch
        self.seed = seed
        self.lengths = [int(n) for n in rng.integers(tokens[0], tokens[1] + 1, size=n_requests)]
        chosen = [examples[i % len(examples)] for i in range(n_requests)]
        self.prompts = [
            dataclasses.replace(decoder.prepare(e.question, list(e.contexts), n), stop=())
            for e, n in zip(chosen, self.lengths)
        ]

    def submit(self, i: int) -> RequestHandle:
        """Queue request `i` (its prompt was rendered and tokenised when the bench was built)."""
        n = self.lengths[i]
        return self.decoder.submit(self.prompts[i], method=self.method, max_new_tokens=n, min_new_tokens=n)

    def capacity(self, probes: int = 4) -> float:
        """Requests per second decoded one at a time (the mix's mean length, on the first prompts): 1 / service time."""
        self.configure("sequential")
        mean = int(round(float(np.mean(self.lengths))))
        self.decoder.generate(self.prompts[0], method=self.method, max_new_tokens=4, min_new_tokens=4)  # warm-up
        start = time.perf_counter()
        for i in range(probes):
            self.decoder.generate(self.prompts[i], method=self.method, max_new_tokens=mean, min_new_tokens=mean)
        return probes / (time.perf_counter() - start)

    def configure(self, mode: str, max_requests: int | None = None) -> None:
        """Set the engine's admission for `mode` (continuous, the engine's default, restores it; `max_requests` caps
        how many decode at once there, None: no cap)."""
        if mode == "continuous":
            self.decoder.configure(admission="continuous", max_requests=max_requests, window_s=0.0)
        elif mode == "static":
            self.decoder.configure(admission="static", max_requests=self.static_batch, window_s=0.01)
        else:
            self.decoder.configure(admission="continuous", max_requests=1, window_s=0.0)

    def run(self, mode: str, rate: float, max_requests: int | None = None) -> dict[str, Any]:
        """Send every request at its Poisson arrival time (`rate` per second); latencies and throughput
        (`max_requests`: a cap on continuous batching, see `configure`)."""
        arrivals = np.cumsum(np.random.default_rng(self.seed + 1).exponential(1.0 / rate, size=len(self.lengths)))
        self.configure(mode, max_requests)
        handles = []
        before = self.decoder.stats
        start = time.perf_counter()
        for i, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            handles.append(self.submit(i))
        results = [h.result() for h in handles]
        end = max(h.finished_at for h in handles)  # type: ignore[type-var]  # every handle has finished
        return {
            "rate_per_s": rate,
            "ttft_s": _percentiles([h.first_token_at - h.submitted_at for h in handles]),  # type: ignore[operator]  # set once finished
            "latency_s": _percentiles([h.finished_at - h.submitted_at for h in handles]),  # type: ignore[operator]  # set once finished
            "examples_per_s": len(handles) / (end - start),  # type: ignore[operator]  # set once finished
            "tokens": [len(r.token_ids) for r in results],
            "prefill": _prefill_counts(before, self.decoder.stats, len(handles)),
            "token_ids": [r.token_ids for r in results],
        }


def _prefill_counts(before: DecoderStats, after: DecoderStats, requests: int) -> dict[str, float]:
    """Prompt tokens (every path) and tokens computed per request from `before` to `after`, and the prefix cache's
    hits, misses and bytes."""
    prompt, computed = after.prompt_tokens - before.prompt_tokens, after.prefill_tokens - before.prefill_tokens
    return {
        "prompt_tokens_per_request": prompt / requests,
        "computed_tokens_per_request": computed / requests,
        "prefix_hits": after.prefix_cache_hits - before.prefix_cache_hits,
        "prefix_misses": after.prefix_cache_misses - before.prefix_cache_misses,
        "prefix_cache_bytes": after.prefix_cache_bytes,
    }


def serving(
    decoder: FidesDecoder,
    examples: Sequence[QAExample],
    *,
    loads: Sequence[float] = (0.5, 1.0, 2.0),
    n_requests: int = 64,
    tokens: tuple[int, int] = (8, 64),
    static_batch: int = 8,
    modes: Sequence[str] = MODES,
    max_num_batched_tokens: int | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Every mode at every load; outputs are compared across modes (greedy: they must be equal).

    `max_num_batched_tokens` sets the engine's step budget for the whole section (None keeps the device default)."""
    if max_num_batched_tokens is not None:
        decoder.configure(max_num_batched_tokens=max_num_batched_tokens)
    bench = ServingBench(decoder, examples, n_requests=n_requests, tokens=tokens, static_batch=static_batch)
    capacity = bench.capacity()
    log(f"sequential capacity {capacity:.3f} requests/s ({n_requests} requests of {tokens[0]}-{tokens[1]} tokens)")
    report: dict[str, Any] = {
        "capacity_per_s": capacity,
        "requests": n_requests,
        "tokens": list(tokens),
        "static_batch": static_batch,
        "max_num_batched_tokens": decoder.limits.max_num_batched_tokens,
        "loads": {},
    }
    try:
        for load in loads:
            by_mode: dict[str, Any] = {}
            for mode in modes:
                by_mode[mode] = bench.run(mode, load * capacity)
                log(
                    f"load {load}x {mode}: p95 latency {by_mode[mode]['latency_s']['p95']:.1f} s, "
                    f"{by_mode[mode]['examples_per_s']:.3f} ex/s"
                )
            outputs = [by_mode[m].pop("token_ids") for m in modes]
            report["loads"][str(load)] = {"modes": by_mode, "identical_outputs": all(o == outputs[0] for o in outputs)}
    finally:
        bench.configure("continuous")
    return report


def format_serving(data: dict[str, Any]) -> str:
    """A markdown table of the serving section."""
    lines = [
        f"{data['requests']} FIDES requests of {data['tokens'][0]}-{data['tokens'][1]} new tokens, Poisson arrivals; "
        f"sequential capacity {data['capacity_per_s']:.3f} requests/s; static batches of up to {data['static_batch']}"
        + (f"; steps of at most {data['max_num_batched_tokens']} tokens." if "max_num_batched_tokens" in data else "."),
        "",
        "| load | mode | TTFT p50 s | TTFT p95 s | latency p50 s | latency p95 s | examples/s | same tokens as the "
        "other modes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load, entry in data["loads"].items():
        for mode, d in entry["modes"].items():
            lines.append(
                f"| {load}x | {mode} | {d['ttft_s']['p50']:.2f} | {d['ttft_s']['p95']:.2f} | "
                f"{d['latency_s']['p50']:.2f} | "
                f"{d['latency_s']['p95']:.2f} | {d['examples_per_s']:.3f} | {entry['identical_outputs']} |"
            )
        modes = entry["modes"]
        for mode, d in modes.items():
            p = d.get("prefill")
            if p and p["prompt_tokens_per_request"]:
                lines.append(
                    f"| {load}x | {mode}: prompt tokens computed per request | | | | | "
                    f"{p['computed_tokens_per_request']:.0f} of {p['prompt_tokens_per_request']:.0f} "
                    f"({p['computed_tokens_per_request'] / p['prompt_tokens_per_request']:.2f}x); prefix cache "
                    f"{p['prefix_hits']} hits, "
                    f"{p['prefix_misses']} misses, {p['prefix_cache_bytes'] / 2**20:.0f} MiB | |"
                )
        if "continuous" in modes and "static" in modes:
            c, s = modes["continuous"], modes["static"]
            lines.append(
                f"| {load}x | continuous / static | | | | {c['latency_s']['p95'] / s['latency_s']['p95']:.2f}x | "
                f"{c['examples_per_s'] / s['examples_per_s']:.2f}x | |"
            )
    return "\n".join(lines)
