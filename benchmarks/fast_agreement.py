"""How often fast mode's answers equal exact mode's, on real backbones.

NQ-Swap conflict rows are decoded greedily under standard, CAD and FIDES, 16 requests in flight at a time, once in
exact mode and once in fast mode (on the CPU, where both run). For each method it reports the share of answers whose
tokens are equal, where the first difference falls, and, for FIDES, the largest |alpha difference| over the steps
where the tokens agree.

    python benchmarks/fast_agreement.py --backbone smollm2-135m-instruct --rows 100 \\
        --out results/fast-agreement/smollm2-135m-instruct.json
    python benchmarks/fast_agreement.py --backbone gemma3-270m --rows 100 --out results/fast-agreement/gemma3-270m.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

METHODS = ("standard", "cad", "fides")


def decode(decoder: FidesDecoder, examples: list[Any], method: str, in_flight: int, new_tokens: int) -> list[Any]:
    """Every example's result, `in_flight` requests submitted at a time."""
    results = []
    for start in range(0, len(examples), in_flight):
        handles = [
            decoder.submit(e.question, list(e.contexts), method=method, max_new_tokens=new_tokens)
            for e in examples[start : start + in_flight]
        ]
        results += [h.result() for h in handles]
    return results


def compare(exact: list[Any], fast: list[Any]) -> dict[str, Any]:
    equal = [a.token_ids == b.token_ids for a, b in zip(exact, fast)]
    alpha_gap = 0.0
    for a, b in zip(exact, fast):
        for x, y in zip(a.steps, b.steps):
            if x.token_id != y.token_id:
                break
            if x.alpha is not None and y.alpha is not None:
                alpha_gap = max(alpha_gap, abs(x.alpha - y.alpha))
    first = [
        next(
            (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
            min(len(a.token_ids), len(b.token_ids)),
        )
        for a, b, same in zip(exact, fast, equal)
        if not same
    ]
    return {
        "equal": sum(equal),
        "rows": len(equal),
        "share_equal": sum(equal) / len(equal),
        "first_differing_token": first,
        "max_alpha_gap_where_tokens_agree": alpha_gap,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="smollm2-135m-instruct", help="a bundled alias, hub id or local path")
    parser.add_argument("--rows", type=int, default=100, help="NQ-Swap conflict rows (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=16, help="requests submitted at a time (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per answer (default: %(default)s)")
    parser.add_argument("--out", required=True, help="JSON results file (written after each method)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.in_flight < 1:
        parser.error("--rows and --in-flight must be at least 1")

    from fides_rag import FidesDecoder, load_model
    from fides_rag.eval.datasets import load_nq_swap

    model, tokenizer = load_model(args.backbone)
    examples = load_nq_swap(limit=args.rows)
    modes = {mode: FidesDecoder(model, tokenizer, mode=mode) for mode in ("exact", "fast")}
    report: dict[str, Any] = {
        "backbone": args.backbone,
        "rows": len(examples),
        "in_flight": args.in_flight,
        "new_tokens": args.new_tokens,
        "methods": {},
    }
    for method in METHODS:
        began = time.perf_counter()
        results = {mode: decode(d, examples, method, args.in_flight, args.new_tokens) for mode, d in modes.items()}
        report["methods"][method] = {
            **compare(results["exact"], results["fast"]),
            "seconds": time.perf_counter() - began,
        }
        fast = modes["fast"].stats
        report["fast_mode_pool"] = {  # so far: prompt blocks fast mode took by reference instead of a copy
            "shared_tokens": fast.kv_pool_shared_tokens,
            "copied_on_write": fast.kv_pool_copied_on_write,
            "prefix_cache_hits": fast.prefix_cache_hits,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        d = report["methods"][method]
        print(
            f"{method}: {d['equal']}/{d['rows']} answers equal, max |alpha gap| "
            f"{d['max_alpha_gap_where_tokens_agree']:.2e}",
            flush=True,
        )
    return report


if __name__ == "__main__":
    main()
