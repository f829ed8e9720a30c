"""A/B decode speed of two revisions of fides-rag in one process, on one loaded model.

The old revision's `fides_rag/` is taken from git (`git archive REV`), renamed to `fides_rag_old` and imported
beside the working tree's `fides_rag`. Each revision times its own decoder with its own benchmark harness
(`fides_rag.eval.bench.Bench.time_ours`: a clock called once per generated token), so each calls its own
public API. The two alternate per prompt and method (order flipped every prompt), so a machine whose speed
drifts hits both alike. Batch 1, greedy, `--tokens` tokens forced; the prompts are built once, by the new
revision, and passed as text, so no template stop ends a decode early.

Shapes: `template` is the 2-shot template of `FidesDecoder.generate` (about 300 tokens on NQ-Swap), `raw` a raw
pair whose no-context prompt is the question alone (about 20 tokens against 160).

    python benchmarks/decoder_ab.py --old REV --model smollm2-135m-instruct --prompts 8 --out ab.json
    python benchmarks/decoder_ab_tables.py ab.json   # the before/after tables

The JSON holds the machine, both revisions, and every prompt's decode ms/token per shape, method and side.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("template", "raw")


def import_revision(revision: str, root: Path = ROOT) -> ModuleType:
    """Extract fides_rag/ at `revision` into a temporary folder as package `fides_rag_old` and import it."""
    target = Path(tempfile.mkdtemp()) / "fides_rag_old"
    archive = subprocess.run(["git", "-C", str(root), "archive", revision, "fides_rag"], capture_output=True)
    if archive.returncode:
        raise SystemExit(
            f"decoder_ab: cannot read fides_rag/ at revision {revision!r}: {archive.stderr.decode().strip()}"
        )
    subprocess.run(["tar", "-x", "-C", str(target.parent)], input=archive.stdout, check=True)
    (target.parent / "fides_rag").rename(target)
    for path in target.rglob("*.py"):
        path.write_text(re.sub(r"\bfides_rag\b", "fides_rag_old", path.read_text()))
    sys.path.insert(0, str(target.parent))
    import fides_rag_old
    import fides_rag_old.eval.bench

    return fides_rag_old


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python benchmarks/decoder_ab.py --old main~5 --out ab.json",
    )
    parser.add_argument(
        "--old", required=True, metavar="REV", help="the revision to compare against (a commit, tag or branch)"
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="bundled alias, hub id or folder (default: %(default)s)"
    )
    parser.add_argument(
        "--prompts", type=int, default=8, help="NQ-Swap prompts measured per shape (default: %(default)s)"
    )
    parser.add_argument("--methods", default="standard,cad,fides", help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--shapes", default="template,raw", help="comma-separated: template, raw (default: %(default)s)"
    )
    parser.add_argument("--tokens", type=int, default=33, help="tokens forced per decode (default: %(default)s)")
    parser.add_argument("--data", help="NQ-Swap parquet (default: $FIDES_RAG_DATA or ../shared/data)")
    parser.add_argument("--out", required=True, type=Path, help="JSON report")
    args = parser.parse_args(argv)
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"--shapes: unknown {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    if args.prompts < 1 or args.tokens < 2:
        parser.error("--prompts must be >= 1 and --tokens >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    old = import_revision(args.old)
    from fides_rag import FidesDecoder, load_model
    from fides_rag.eval.bench import Bench, machine
    from fides_rag.eval.datasets import load_nq_swap

    model, tokenizer = load_model(args.model, device="cpu")
    examples = load_nq_swap(args.data)[: args.prompts + 1]
    benches = {
        "old": old.eval.bench.Bench(old.FidesDecoder(model, tokenizer), examples),
        "new": Bench(FidesDecoder(model, tokenizer), examples),
    }
    methods, shapes = args.methods.split(","), args.shapes.split(",")

    def prompt_pair(example, shape: str) -> tuple[str, str]:
        return benches["new"].prompts(example, args.tokens) if shape == "template" else Bench.raw_prompts(example)

    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    for shape in shapes:
        for bench in benches.values():  # the flag says whether the prompts already carry the chat template's tokens
            bench.templated = shape == "template" and benches["new"].decoder.prompts.use_chat_template
        warmup, *measured = examples
        for bench in benches.values():
            for method in methods:
                bench.time_ours(method, *prompt_pair(warmup, shape), 3)
        for i, example in enumerate(measured):
            prompts = prompt_pair(example, shape)
            for method in methods:
                for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    timing = benches[side].time_ours(method, *prompts, args.tokens)
                    samples.setdefault(shape, {}).setdefault(method, {}).setdefault(side, []).append(
                        timing.decode_s_per_token * 1000
                    )
    medians = {
        s: {m: {side: statistics.median(v) for side, v in by_side.items()} for m, by_side in by_method.items()}
        for s, by_method in samples.items()
    }
    report = {
        "model": args.model,
        "old_revision": args.old,
        "new_revision": _head(),
        "prompts": args.prompts,
        "tokens": args.tokens,
        "machine": machine(),
        "median_decode_ms_per_token": medians,
        "decode_ms_per_token": samples,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(medians, indent=1))


def _head() -> str:
    """The working tree's commit, marked '+changes' when it has uncommitted edits."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "fides_rag"], capture_output=True, text=True
    ).stdout.strip()
    return head + ("+changes" if dirty else "")


if __name__ == "__main__":
    main()
