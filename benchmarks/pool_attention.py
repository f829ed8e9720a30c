"""Fast mode's attention over each row's own pool blocks, on a real backbone (CPU): the decode step of one short
FIDES request in a small and a large pool (its cost should not follow the pool), and the decode step of 32 FIDES
requests in fast mode against exact mode.

Each engine step is timed (`FidesDecoder.around_steps`); a decode step is one that ran no prefill chunk while every
request was decoding, and the figure is the median of those steps.

    python benchmarks/pool_attention.py --out results/pool-attention/smollm2-135m-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import fides_rag
from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.eval.dispatch_counts import DispatchCounter
from fides_rag.testing import build_tiny_model, build_tokenizer

DOCUMENT = "The Seine flows through Paris and the Loire flows through Orleans; both reach the Atlantic Ocean. "


class StepTimer:
    """Durations (and, with `count`, aten ops) of the engine's steps that ran no prefill chunk while `requests`
    requests were decoding."""

    def __init__(self, decoder: FidesDecoder, requests: int, count: bool = False) -> None:
        self.decoder, self.requests, self.count = decoder, requests, count
        self.times: list[float] = []
        self.ops: list[int] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        stats = self.decoder.stats
        before, decoding = stats.prefill_tokens, stats.requests_in_flight
        counter = DispatchCounter() if self.count else contextlib.nullcontext()
        start = time.perf_counter()
        with counter:
            yield
        elapsed = time.perf_counter() - start
        if (
            self.decoder.stats.prefill_tokens == before
            and decoding == self.requests
            and self.decoder.stats.queue_length == 0
        ):
            self.times.append(elapsed)
            if self.count:
                self.ops.append(counter.totals.op_count)


def decode_ms(
    decoder: FidesDecoder, requests: int, new_tokens: int, context_repeats: int, count: bool = False
) -> dict[str, Any]:
    """Median decode step of `requests` FIDES requests (request i's document repeated context_repeats + i % 4 times)."""
    timer = StepTimer(decoder, requests, count)
    with decoder.around_steps(timer):
        handles = [
            decoder.submit(
                f"Which ocean does river {i} reach?",
                [DOCUMENT * (context_repeats + i % 4)],
                method="fides",
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
            for i in range(requests)
        ]
        results = [h.result() for h in handles]
    return {
        "decode_ms": statistics.median(timer.times) * 1000 if timer.times else None,
        "decode_steps": len(timer.times),
        "rows": decoder.stats.peak_rows,
        "tokens": [r.token_ids for r in results[:2]],
        **({"ops_per_step": statistics.median(timer.ops)} if count and timer.ops else {}),
    }


def timing(args: argparse.Namespace, template: PromptTemplate, report: dict[str, Any]) -> None:
    """The backbone's decode steps: one request in each pool size, then many requests in each mode."""
    model, tokenizer = fides_rag.load_model(args.backbone, dtype=torch.float32)
    report.update(
        {
            "backbone": args.backbone,
            "dtype": "float32",
            "device": "cpu",
            "threads": args.threads,
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "new_tokens": args.new_tokens,
            "one_request": {},
            "many_requests": {},
        }
    )
    pools = {
        int(p): FidesDecoder(model, tokenizer, prompt_template=template, mode="fast", kv_pool_tokens=int(p))
        for p in args.pools.split(",")
    }
    for _ in range(3):  # interleaved repetitions on a shared machine: the best median of each
        for pool, decoder in pools.items():
            decode_ms(decoder, 1, 3, 1)  # warm-up
            run = decode_ms(decoder, 1, args.new_tokens * 2, 1)
            best = report["one_request"].get(str(pool))
            if best is None or run["decode_ms"] < best["decode_ms"]:
                report["one_request"][str(pool)] = run
            print(pool, run["decode_ms"], flush=True)
    one = report["one_request"]
    sizes = sorted(one, key=int)
    report["one_request_ratio_large_to_small"] = one[sizes[-1]]["decode_ms"] / one[sizes[0]]["decode_ms"]
    for mode in ("exact", "fast"):
        decoder = FidesDecoder(model, tokenizer, prompt_template=template, mode=mode)
        report["many_requests"][mode] = decode_ms(decoder, args.requests, args.new_tokens, 1)
        report["many_requests"][mode]["kv_pool_tokens"] = decoder.stats.kv_pool_tokens
        print(mode, report["many_requests"][mode]["decode_ms"], flush=True)
    many = report["many_requests"]
    report["many_requests_fast_to_exact"] = many["fast"]["decode_ms"] / many["exact"]["decode_ms"]


def op_counts(args: argparse.Namespace, template: PromptTemplate, report: dict[str, Any]) -> None:
    """Fast mode's aten ops per FIDES decode step at 1 and `args.requests` requests (a tiny Llama of 32 layers)."""
    tokenizer = build_tokenizer()
    tiny = build_tiny_model("llama", len(tokenizer), num_hidden_layers=32, max_position_embeddings=4096)
    report["ops"] = {}
    for requests in (1, args.requests):
        decoder = FidesDecoder(tiny, tokenizer, prompt_template=template, mode="fast", kv_pool_tokens=131072)
        report["ops"][str(requests)] = decode_ms(decoder, requests, 96, 1, count=True)[
            "ops_per_step"
        ]  # long enough that all overlap
    report["ops_ratio_many_to_one"] = report["ops"][str(args.requests)] / report["ops"]["1"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backbone", default="smollm2-135m-instruct", help="a bundled backbone name (default smollm2-135m-instruct)"
    )
    parser.add_argument(
        "--pools", default="1024,65536", help="pool sizes in positions for the one-request case (default 1024,65536)"
    )
    parser.add_argument("--requests", type=int, default=32, help="requests of the many-request case (default 32)")
    parser.add_argument("--new-tokens", type=int, default=12, help="tokens each request decodes (default 12)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--sections",
        default="timing,ops",
        help="what to run: timing (the backbone's steps), ops (aten op counts); default both. The results "
        "file keeps the sections not run",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    template = PromptTemplate(stop=())
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    sections = set(args.sections.split(","))
    if "timing" in sections:
        timing(args, template, report)
    if "ops" in sections:
        op_counts(args, template, report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if "ratio" in k or "to_exact" in k or k == "ops"}))


if __name__ == "__main__":
    main()
