"""What grammar masking adds to one decode step of a batch: `fides_rag.generation.grammar.constraint` on the real
tokenizers,
8 rows with different schemas, each step = fill the host bitmask (llguidance, in parallel), apply it to the
[8, V] logits (one masked_fill), accept each row's token. Each step's time is the minimum over --passes passes.

    .venv/bin/python benchmarks/grammar_step_cost.py --out results/grammar-libraries/step-cost-cpu-2core.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from grammar_libraries import SCHEMAS, valid_documents  # the sibling script's schemas and documents

from fides_rag.generation.grammar.constraint import GrammarConstraint, fill_bitmask
from fides_rag.generation.grammar.masks import allocate_bitmask, apply_bitmask


def measure(model: str, rows: int, passes: int, seed: int) -> dict:
    from transformers import AutoTokenizer

    from fides_rag.models.loading import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(model))
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    start = time.perf_counter()
    constraints = {name: GrammarConstraint.compile(tokenizer, json_schema=schema) for name, schema in SCHEMAS.items()}
    first_compile = time.perf_counter() - start  # includes preparing the tokenizer, once per process
    names = list(constraints)
    streams = []
    for r in range(rows):
        name = names[r % len(names)]
        _, text = valid_documents(SCHEMAS[name], 1, seed + r)[0]
        text = json.dumps(json.loads(text))  # the one-line form the room's JSON grammar writes
        streams.append(tokenizer.encode(text, add_special_tokens=False) + [eos])
    steps = max(len(s) for s in streams)
    streams = [s + [eos] * (steps - len(s)) for s in streams]  # a finished row stays in the batch, emitting EOS
    best = {k: np.full(steps, np.inf) for k in ("fill", "apply", "accept")}
    logits = torch.randn(rows, vocab)
    for _ in range(passes):
        states = [constraints[names[r % len(names)]].start() for r in range(rows)]
        for step in range(steps):
            t0 = time.perf_counter()
            bitmask = allocate_bitmask(rows, vocab)
            fill_bitmask(states, bitmask)
            t1 = time.perf_counter()
            apply_bitmask(logits, bitmask)  # in place: the work does not depend on what was masked before
            t2 = time.perf_counter()
            for state, stream in zip(states, streams):
                state.accept(stream[step])
            t3 = time.perf_counter()
            for key, seconds in (("fill", t1 - t0), ("apply", t2 - t1), ("accept", t3 - t2)):
                best[key][step] = min(best[key][step], seconds)
    total = best["fill"] + best["apply"] + best["accept"]
    return {
        "model": model,
        "vocab": vocab,
        "rows": rows,
        "steps": steps,
        "first_compile_s": first_compile,
        **{f"{k}_ms_mean": 1e3 * float(v.mean()) for k, v in best.items()},
        "step_ms_mean": 1e3 * float(total.mean()),
        "step_ms_p95": 1e3 * float(np.percentile(total, 95)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (on a shared 2-core machine two threads spin against other processes)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(m, args.rows, args.passes, args.seed) for m in args.models]
    for r in rows:
        print(
            f"{r['model']:22s} V={r['vocab']:6d} rows={r['rows']} fill {r['fill_ms_mean']:.3f} ms  apply "
            f"{r['apply_ms_mean']:.3f} ms  accept {r['accept_ms_mean']:.3f} ms  step {r['step_ms_mean']:.3f} ms "
            f"(p95 {r['step_ms_p95']:.3f})"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "date": datetime.date.today().isoformat(),
            "machine": {
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "load_average_at_end": os.getloadavg(),
            },
            "settings": vars(args) | {"out": str(args.out)},
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
