"""KV traffic and op count per decode step, by context length: bytes written by copy, cat and pad kernels per decoded
token, aten ops per decode step (both counted with a TorchDispatchMode: exact, the same on any machine) and decode
time per token on this machine, for fides-rag's standard, CAD and FIDES and transformers' `generate`.

Prompts are raw (no template): the context prompt is NQ-Swap passages cut to fill the length, then the question;
the no-context prompt is the question alone. Each (length, method) is one forced-length greedy decode: decode steps
1..--counted-steps are counted, the next --timed-steps are timed without the counter.

    nice -n 19 python benchmarks/kv_traffic.py --lengths 256,1024,4096,16384 --out results/kv-traffic/before.json
    python benchmarks/kv_traffic.py --table results/kv-traffic/before.json   # several files: merged
    python benchmarks/kv_traffic.py --table results/kv-traffic/before*.json --after results/kv-traffic/after*.json

Lengths the model cannot hold (SmolLM2: 8,192 positions) run on a random-weight model of the same configuration with
a longer max_position_embeddings: the counts do not depend on the weights. Entries already in --out are kept
(a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

METHODS = ("standard", "cad", "fides", "generate")
GENERATE_INFERENCE_MODE = "generate-inference-mode"
"""transformers' generate inside torch.inference_mode, as fides-rag's engine runs (the dispatcher then sees whole
`linear` calls instead of their decompositions): for comparing op counts."""
HEADERS = {
    "standard": "standard",
    "cad": "CAD",
    "fides": "FIDES",
    "generate": "transformers `generate`",
    GENERATE_INFERENCE_MODE: "`generate` under inference_mode",
}


def prompt_ids(tokenizer: Any, data: str | None, length: int) -> tuple[list[int], list[int]]:
    """(context ids, no-context ids): passages cut so the context prompt holds `length` tokens, then the question."""
    from fides_rag.eval.datasets import load_nq_swap

    examples = load_nq_swap(data)
    question = tokenizer(f"\nQuestion: {examples[0].question}\nAnswer:", add_special_tokens=False)["input_ids"]
    corpus: list[int] = []
    for example in examples:
        if len(corpus) >= length:
            break
        corpus += tokenizer(" ".join(example.contexts) + " ", add_special_tokens=False)["input_ids"]
    if len(corpus) < length - len(question):
        raise SystemExit(f"the NQ-Swap passages hold {len(corpus)} tokens, fewer than the {length} asked for")
    return corpus[: length - len(question)] + question, question


def random_twin(model: Any, positions: int) -> Any:
    """A random-weight model with `model`'s configuration and `positions` positions."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config.max_position_embeddings = positions
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=model.dtype).eval()


def measure(args: argparse.Namespace) -> None:
    from fides_rag import FidesDecoder, load_model
    from fides_rag.eval.bench import machine
    from fides_rag.eval.step_probe import measure_engine, measure_generate, prepared_from_ids

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    model, tokenizer = load_model(args.model, device="cpu")
    limit = model.config.max_position_embeddings
    new_tokens = 1 + args.counted_steps + args.timed_steps
    report["model"] = args.model
    report["protocol"] = {
        "prompts": "raw: NQ-Swap passages then the question / the question alone",
        "greedy": True,
        "counted": "decode steps 1..counted_steps under the counter",
        "timed": "the next timed_steps, without it",
    }
    twin = None
    for length in args.lengths:
        real = length + new_tokens <= limit
        if not real and twin is None:
            twin = random_twin(model, max(args.lengths) + new_tokens)
        used = model if real else twin
        decoder = FidesDecoder(used, tokenizer)
        context_ids, no_context_ids = prompt_ids(tokenizer, args.data, length)
        runs = report["runs"].setdefault(str(length), {})
        for method in args.methods:
            if method in runs:
                continue
            print(f"{length} tokens, {method} ...", file=sys.stderr, flush=True)
            if method.startswith("generate"):
                result = measure_generate(
                    used,
                    context_ids,
                    new_tokens,
                    args.counted_steps,
                    pad_token_id=tokenizer.pad_token_id or 0,
                    inference_mode=method == GENERATE_INFERENCE_MODE,
                )
            else:
                result = measure_engine(
                    decoder,
                    prepared_from_ids(tokenizer, context_ids, no_context_ids),
                    method,
                    new_tokens,
                    args.counted_steps,
                )
            result.pop("token_ids")
            last = result["steps"][-1]
            result["op_calls_last_counted_step"] = last["op_calls"]
            for step in result["steps"]:
                step.pop("op_calls")
            runs[method] = {
                "context_tokens": len(context_ids),
                "no_context_tokens": len(no_context_ids),
                "load_average_1min": os.getloadavg()[0],
                "weights": "real"
                if real
                else f"random, {args.model}'s configuration with "
                f"max_position_embeddings={twin.config.max_position_embeddings}",
                **result,
            }
            report["machine"] = machine()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2) + "\n")
    print(tables(report))


def _traffic(run: dict[str, Any]) -> str:
    return f"{run['traffic_bytes_per_token']['median'] / 1e6:.2f} [{run['traffic_bytes_per_token']['max'] / 1e6:.2f}]"


def _decode_ms(run: dict[str, Any]) -> str:
    return "-" if run["decode_ms_per_token"] is None else f"{run['decode_ms_per_token']:.1f}"


def _ops(run: dict[str, Any]) -> str:
    return f"{run['ops_per_token']:,.0f}"


def _table(runs: dict[str, Any], after: dict[str, Any] | None, methods: list[str], text: Any) -> list[str]:
    """Markdown rows: one per context length, one cell per method ("before → after" when `after` is given)."""
    lines = ["| context tokens | " + " | ".join(HEADERS[m] for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for length in sorted({*runs, *(after or {})}, key=int):
        cells = []
        for method in methods:
            found = runs.get(length, {}).get(method)
            cell = "-" if found is None else text(found)
            if after is not None:
                found = after.get(length, {}).get(method)
                cell += " → " + ("-" if found is None else text(found))
            cells.append(cell)
        lines.append(f"| {int(length):,} | " + " | ".join(cells) + " |")
    return lines


def tables(report: dict[str, Any], after: dict[str, Any] | None = None) -> str:
    """Markdown: traffic per decoded token, decode time per token, ops per decode step; with `after` (another report),
    each cell reads "this report's figure → after's"."""
    runs = report["runs"]
    every = [runs, *([after["runs"]] if after else [])]
    methods = [m for m in (*METHODS, GENERATE_INFERENCE_MODE) if any(m in r for by in every for r in by.values())]
    traffic_methods = [m for m in methods if m != GENERATE_INFERENCE_MODE]
    later = after["runs"] if after else None
    arrow = " (before → after)" if after else ""
    return "\n".join(
        [
            f"MB written by copy, cat and pad kernels per decoded token{arrow} (median decode step; max step in "
            "brackets):",
            "",
            *_table(runs, later, traffic_methods, _traffic),
            "",
            f"Decode ms per token on this machine{arrow} (mean of the timed steps):",
            "",
            *_table(runs, later, traffic_methods, _decode_ms),
            "",
            f"aten ops per decode step{arrow} (median):",
            "",
            *_table(runs, later, methods, _ops),
        ]
    )


def merged(paths: list[str]) -> dict[str, Any]:
    """The runs of several results files, by context length (ascending)."""
    runs: dict[str, Any] = {}
    for path in paths:
        for length, by in json.loads(Path(path).read_text())["runs"].items():
            runs.setdefault(length, {}).update(by)
    return {"runs": dict(sorted(runs.items(), key=lambda item: int(item[0])))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a load_model name (default: %(default)s)")
    parser.add_argument(
        "--lengths",
        type=lambda s: [int(x) for x in s.split(",")],
        default="256,1024,4096,16384",
        help="context prompt lengths in tokens, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--methods",
        type=lambda s: s.split(","),
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join((*METHODS, GENERATE_INFERENCE_MODE))} (default: %(default)s)",
    )
    parser.add_argument("--counted-steps", type=int, default=8, help="decode steps counted (default: %(default)s)")
    parser.add_argument(
        "--timed-steps", type=int, default=8, help="decode steps timed after them (default: %(default)s)"
    )
    parser.add_argument(
        "--data", default=None, help="benchmark data folder (default: $FIDES_RAG_DATA or ../shared/data)"
    )
    parser.add_argument("--out", help="JSON results file; entries already in it are kept")
    parser.add_argument(
        "--table", metavar="FILE", nargs="+", help="print the markdown tables of results files (merged) and exit"
    )
    parser.add_argument(
        "--after",
        metavar="FILE",
        nargs="+",
        help="with --table: results files of a later revision (merged); each cell reads 'before → after'",
    )
    args = parser.parse_args(argv)
    if args.after and not args.table:
        parser.error("--after compares with the files of --table")
    if args.table:
        print(tables(merged(args.table), merged(args.after) if args.after else None))
        return
    if not args.out:
        parser.error("--out is required to measure")
    unknown = set(args.methods) - {*METHODS, GENERATE_INFERENCE_MODE}
    if unknown or args.counted_steps < 1 or args.timed_steps < 0:
        parser.error(
            f"unknown methods {sorted(unknown)}" if unknown else "--counted-steps must be >= 1 and --timed-steps >= 0"
        )
    measure(args)


if __name__ == "__main__":
    main()
