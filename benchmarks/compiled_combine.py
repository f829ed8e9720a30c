"""One lane's combine and greedy choice, eager against compiled (what fast mode with `compile` runs per lane), on
random logits of a model's shape: the time per call, the aten ops the eager call dispatches (each a kernel launch on a
GPU), and whether the chosen tokens agree.

Each method's lane takes `--rows` requests: their context and no-context rows, a logit-lens row where the rule reads
one, and per-layer states where it reads them. `lane` below is the engine's lane function
(`generation/engine/captured_decide.py`), copied because benchmarks reach the engine only through the decoder; it is
compiled as the engine compiles it (dynamic shapes, inductor by default).

    python benchmarks/compiled_combine.py --out results/compiled-combine/smollm2-shape-cpu.json
    python benchmarks/compiled_combine.py --vocab 128256 --layers 32 --hidden 4096 --device cuda --out ...
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import fides_rag
from fides_rag import get_method
from fides_rag.eval.dispatch_counts import DispatchCounter
from fides_rag.rules.base import CONTEXT, NO_CONTEXT, StepInputs


def decide_lane(
    rule: Any,
    logits: torch.Tensor,
    layer_states: torch.Tensor | None,
    rows: dict[str, torch.Tensor],
    lens: dict[int, torch.Tensor],
    num_layers: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One lane's combine, argmax and NaN/inf checks, as the engine's compiled lane function computes them."""
    step = StepInputs(
        logits={path: logits[index] for path, index in rows.items()},
        lens_logits={layer: logits[index] for layer, index in lens.items()},
        num_layers=num_layers,
    )
    if layer_states is not None:
        for path in rule.layer_state_paths:
            step.layer_states[path] = layer_states[:, rows[path]]
    decided = rule.combine(step)
    scores = decided.logits
    read = [*step.logits.values(), *step.lens_logits.values()]
    not_finite = torch.stack([~torch.isfinite(x).flatten(1).all(dim=-1) for x in read]).any(dim=0)
    return scores.argmax(dim=-1), not_finite, torch.isnan(scores).any(dim=-1), dict(decided.records)


def inputs(rule: Any, rows: int, vocab: int, layers: int, hidden: int, device: torch.device) -> dict[str, Any]:
    """Random inputs of one lane of `rows` requests: logits [2 rows + lens rows, V], states [L, 2 rows, H]."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    lens_layers = rule.lens_layers(layers)
    total = 2 * rows + rows * len(lens_layers)
    logits = (torch.randn(total, vocab, generator=generator) * 4).to(device)
    states = torch.randn(layers, 2 * rows, hidden, generator=generator).to(device) if rule.layer_state_paths else None
    index = {CONTEXT: torch.arange(rows), NO_CONTEXT: torch.arange(rows, 2 * rows)}
    lens = {layer: torch.arange(2 * rows + k * rows, 2 * rows + (k + 1) * rows) for k, layer in enumerate(lens_layers)}
    return {
        "rule": rule,
        "logits": logits,
        "layer_states": states,
        "rows": {p: i.to(device) for p, i in index.items() if p in rule.paths or p == CONTEXT},
        "lens": {layer: i.to(device) for layer, i in lens.items()},
        "num_layers": layers,
    }


def timed(call: Any, repeats: int, device: torch.device) -> float:
    """Median milliseconds of `call()` over `repeats` calls (after three warm-up calls)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = call()
        out[0].tolist()  # the step's one host transfer
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="standard,cad,fides,fides+evidence")
    parser.add_argument("--rows", default="1,32", help="requests in the lane (comma-separated)")
    parser.add_argument("--vocab", type=int, default=49152, help="default: SmolLM2's")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    report: dict[str, Any] = {
        "shape": {"vocab": args.vocab, "layers": args.layers, "hidden": args.hidden},
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fides_rag": fides_rag.__version__,
        "backend": args.backend,
        "results": [],
    }
    for method in args.methods.split(","):
        rule = get_method(method)
        compiled = torch.compile(decide_lane, fullgraph=False, dynamic=None, backend=args.backend)
        for rows in (int(r) for r in args.rows.split(",")):
            lane = inputs(rule, rows, args.vocab, args.layers, args.hidden, device)
            with DispatchCounter() as counter:
                eager_out = decide_lane(**lane)
            start = time.perf_counter()
            compiled_out = compiled(**lane)
            compile_s = time.perf_counter() - start
            row = {
                "method": method,
                "rows": rows,
                "eager_ms": timed(lambda lane=lane: decide_lane(**lane), args.repeats, device),
                "compiled_ms": timed(lambda lane=lane, compiled=compiled: compiled(**lane), args.repeats, device),
                "eager_aten_ops": counter.totals.op_count,
                "first_compile_s": compile_s,
                "tokens_equal": bool(torch.equal(eager_out[0], compiled_out[0])),
            }
            row["speedup"] = row["eager_ms"] / row["compiled_ms"]
            report["results"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("| method | rows | eager ms | compiled ms | speedup | eager aten ops | tokens equal |")
    print("|---|---|---|---|---|---|---|")
    for r in report["results"]:
        print(
            f"| {r['method']} | {r['rows']} | {r['eager_ms']:.2f} | {r['compiled_ms']:.2f} | {r['speedup']:.2f}x | "
            f"{r['eager_aten_ops']} | {r['tokens_equal']} |"
        )


if __name__ == "__main__":
    main()
