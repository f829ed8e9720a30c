"""A compiled decoder on a seeded mix of prompts of 1 to 5,000 tokens: how many of its decode steps run captured after
one warm-up, how many graphs the warm-up compiled and how long it took, and whether every answer equals the eager
decoder's.

The model is a random-weight Llama of one layer, 64 wide, so compiling (torch.compile's `eager` backend by default:
graph capture without code generation) and not arithmetic is what the warm-up costs. Requests come in waves of
--wave, submitted together, so the rows in flight (and the bucket a step runs at) vary; each request's method,
document length (log-uniform) and new tokens are drawn from --seed.

    OMP_NUM_THREADS=2 python benchmarks/captured_mix.py --out results/captured-mix/cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

WORD = " Lyon"
"""The document's word (about three tokens each with the test tokenizer)."""


def tiny_model(vocab: int) -> Any:
    from fides_rag.testing import HOST_BOUND_LLAMA, build_tiny_model

    return build_tiny_model("llama", vocab, max_position_embeddings=8192, **HOST_BOUND_LLAMA)


def draw_requests(args: argparse.Namespace, tokenizer: Any) -> list[dict[str, Any]]:
    """The seeded mix: per request its method, document and new tokens; documents of 1 to --max-prompt tokens."""
    rng = random.Random(args.seed)
    per_word = len(tokenizer(WORD * 100).input_ids) / 100
    methods = args.methods.split(",")
    drawn = []
    for _ in range(args.requests):
        tokens = math.exp(rng.uniform(0, math.log(args.max_prompt)))
        words = max(1, int(tokens / per_word))
        drawn.append(
            {
                "method": rng.choice(methods),
                "document": (WORD * words).strip(),
                "new_tokens": rng.randint(args.min_new, args.max_new),
            }
        )
    return drawn


def decode_all(decoder: Any, drawn: list[dict[str, Any]], wave: int) -> list[list[int]]:
    """Every request's tokens, submitted in waves of `wave` requests."""
    tokens: list[list[int]] = []
    for start in range(0, len(drawn), wave):
        handles = [
            decoder.submit(
                "Where?",
                [r["document"]],
                method=r["method"],
                max_new_tokens=r["new_tokens"],
                min_new_tokens=r["new_tokens"],
            )
            for r in drawn[start : start + wave]
        ]
        tokens += [handle.result().token_ids for handle in handles]
    return tokens


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from fides_rag import FidesDecoder, PromptTemplate
    from fides_rag.testing import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = tiny_model(len(tokenizer))
    drawn = draw_requests(args, tokenizer)
    prompt_tokens = [len(tokenizer(r["document"]).input_ids) for r in drawn]
    options: dict[str, Any] = dict(prompt_template=PromptTemplate(stop=()), mode="fast", kv_pool_tokens=args.pool)
    methods = sorted(set(args.methods.split(",")))
    buckets = None if args.buckets == "default" else [int(b) for b in args.buckets.split(",")]
    before = graphs_compiled()
    start = time.perf_counter()
    captured = FidesDecoder(model, tokenizer, compile=args.backend, buckets=buckets, warmup=methods, **options)
    warmup_s = time.perf_counter() - start
    warmup_graphs = graphs_compiled() - before
    got = decode_all(captured, drawn, args.wave)
    stats = captured.stats
    eager = FidesDecoder(model, tokenizer, **options)
    want = decode_all(eager, drawn, args.wave)
    return {
        "model": "random-weight Llama, 1 layer, hidden 64, 4 heads (2 KV heads), float32",
        "backend": args.backend,
        "buckets": "default" if buckets is None else buckets,
        "methods": methods,
        "requests": len(drawn),
        "wave": args.wave,
        "seed": args.seed,
        "prompt_tokens": {"min": min(prompt_tokens), "max": max(prompt_tokens)},
        "warmup_s": round(warmup_s, 1),
        "warmup_graphs": warmup_graphs,
        "graphs_after_warmup": graphs_compiled() - before - warmup_graphs,
        "decode_steps": stats.steps,
        "eager_steps": stats.captured_fallback_steps,
        "eager_share": round(stats.captured_fallback_steps / max(stats.steps, 1), 4),
        "failed": stats.failed,
        "answers_equal_to_eager": sum(a == b for a, b in zip(got, want)),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="eager", help="torch.compile backend (eager: capture, no codegen)")
    parser.add_argument("--buckets", default="default", help="comma-separated row counts, or default")
    parser.add_argument("--methods", default="standard,fides", help="comma-separated methods drawn per request")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--wave", type=int, default=8, help="requests submitted together")
    parser.add_argument("--max-prompt", type=int, default=5000, help="the longest document, in tokens")
    parser.add_argument("--min-new", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=12)
    parser.add_argument("--pool", type=int, default=1 << 17, help="kv_pool_tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="results JSON (printed either way)")
    args = parser.parse_args(argv)
    for name in ("requests", "wave", "max_prompt", "min_new", "pool"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_new < args.min_new:
        parser.error("--max-new must be at least --min-new")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if report["failed"]:
        print(f"{report['failed']} requests failed", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
