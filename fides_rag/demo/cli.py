"""The `fides-rag demo` sub-command. fides_rag.cli.main wires it in:

from fides_rag.demo.cli import add_demo_parser, run_demo_command
add_demo_parser(commands)                       # in build_parser
if args.command == "demo": return run_demo_command(args)   # in main
"""

from __future__ import annotations

import argparse
import os
import sys

from fides_rag.demo.run import DEFAULT_K, DEFAULT_LIMITS, DEFAULT_METHODS, DEFAULT_MODEL, DEFAULT_NOISE, DemoSettings
from fides_rag.eval.datasets import DATA_ENV
from fides_rag.models.options import add_model_arguments, load_options


def _noise(value: str) -> tuple[float, ...]:
    """'0,0.2,0.5' (shares) or '0,20,50' / '0%,20%,50%' (percentages: any value above 1 or with '%')."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one noise level")
    try:
        numbers = [float(p.rstrip("%")) for p in parts]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"noise levels are shares like 0,0.2,0.5 or percentages like 0,20,50; got {value!r}"
        ) from error
    percent = any(p.endswith("%") for p in parts) or any(n > 1 for n in numbers)
    shares = tuple(n / 100 if percent else n for n in numbers)
    bad = [p for p, s in zip(parts, shares) if not 0 <= s <= 1]
    if bad:
        raise argparse.ArgumentTypeError(f"noise level(s) {bad} outside 0..1 (0%..100%)")
    return shares


def _methods(value: str) -> tuple[str, ...]:
    from fides_rag.rules import parse_method_names

    try:
        return tuple(parse_method_names(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return number


def add_demo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `demo` sub-command to a `fides-rag` sub-parser collection."""
    demo = subparsers.add_parser(
        "demo",
        help="noisy-retrieval demo: FAISS top-k with 0/20/50%% irrelevant documents, accuracy per method",
        description=(
            "Retrieve the top-k passages per question (all-MiniLM-L6-v2 + FAISS), replace 0%, 20% and 50% of them "
            "with random passages that hold no gold alias, answer with standard RAG, CAD, AdaCAD and FIDES, and "
            "report accuracy, each method's drop, recall@k, a plot and a JSON record. Without --data/--corpus it "
            f"uses the corpus shipped with the package; --data, --corpus popqa or ${DATA_ENV} switch to PopQA "
            "long-tail."
        ),
    )
    demo.add_argument(
        "--corpus",
        choices=["demo", "popqa"],
        default=None,
        help=f"demo: the embedded corpus (default); popqa: PopQA long-tail from --data, ${DATA_ENV}/popqa "
        "or ../shared/data/popqa",
    )
    demo.add_argument(
        "--data", help="folder with popqa_longtail.jsonl and popqa_longtail_passages.txt (implies --corpus popqa)"
    )
    demo.add_argument("--model", default=DEFAULT_MODEL, help="bundled alias, hub id, local folder or .gguf file")
    demo.add_argument(
        "--methods",
        type=_methods,
        default=DEFAULT_METHODS,
        help="comma-separated, or all (default standard,cad,adacad,fides)",
    )
    demo.add_argument(
        "--k", type=_positive, default=DEFAULT_K, help=f"documents retrieved per question (default {DEFAULT_K})"
    )
    demo.add_argument(
        "--noise",
        type=_noise,
        default=DEFAULT_NOISE,
        help="shares of irrelevant documents, e.g. 0,0.2,0.5 or 0,20,50 (default)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seeds the question sample and the noise (default 0)")
    demo.add_argument(
        "--limit",
        type=_positive,
        default=None,
        help=f"questions to use, drawn evenly across question kinds (default {DEFAULT_LIMITS['demo']} of the embedded "
        f"corpus's 48, {DEFAULT_LIMITS['popqa']} of PopQA's 1399)",
    )
    demo.add_argument("--batch-size", type=_positive, default=8, help="prompts decoded together (default 8)")
    demo.add_argument("--max-new-tokens", type=_positive, default=16, help="answer length budget (default 16)")
    demo.add_argument(
        "--protect-gold",
        action="store_true",
        help="replace documents holding a gold alias last (default: replaced positions are fully random)",
    )
    demo.add_argument(
        "--doc-order",
        choices=["best-last", "best-first"],
        default="best-last",
        help="prompt order of the retrieved documents (default best-last: the most similar next to the question)",
    )
    add_model_arguments(demo)
    demo.add_argument(
        "--out",
        default=None,
        help="folder for results.json, accuracy.png and the decoded answers; rerun with the same folder to "
        "resume (default runs/demo/<corpus>-<model>)",
    )
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    return demo


def _extra_load_options(args: argparse.Namespace) -> dict | None:
    """--dtype, --device-map and --offload-folder as `load_model` keywords; None when all are left at their defaults."""
    extra = {k: v for k, v in load_options(args).items() if k != "device" and v is not None}
    return extra or None


def settings_from_args(args: argparse.Namespace) -> DemoSettings:
    corpus = args.corpus
    if corpus is None:
        corpus = "popqa" if args.data or os.environ.get(DATA_ENV) else "demo"
    if corpus == "demo" and args.data:
        raise ValueError("--data names PopQA data; drop --corpus demo or --data")
    return DemoSettings(
        corpus=corpus,
        data=args.data,
        model=args.model,
        methods=tuple(args.methods),
        k=args.k,
        noise=tuple(args.noise),
        seed=args.seed,
        limit=args.limit,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        load_options=_extra_load_options(args),
        out=args.out,
        protect_gold=args.protect_gold,
        doc_order=args.doc_order,
    )


def run_demo_command(args: argparse.Namespace) -> int:
    """Run `fides-rag demo` from parsed arguments; print the table; return the exit code."""
    from fides_rag.demo.run import format_table, run_demo

    settings = None
    try:
        settings = settings_from_args(args)
        report = run_demo(settings, progress=not args.quiet, log=lambda m: print(m, file=sys.stderr))
    except (FileNotFoundError, ValueError) as error:
        print(f"fides-rag demo: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = settings.out_folder() if settings is not None else "the run folder"
        print(
            f"\nfides-rag demo: interrupted; the answers so far are in {where}; rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    print(format_table(report))
    print(
        f"JSON: {report['files']['json']}\nmarkdown: {report['files']['markdown']}\nplot: {report['files']['plot']}\n"
        f"time: {report['timing_s']['total']:.0f} s (decoding {report['timing_s']['decoding']:.0f} s)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m fides_rag.demo.cli` — the demo without the main CLI."""
    parser = argparse.ArgumentParser(prog="fides-rag")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    return run_demo_command(parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
